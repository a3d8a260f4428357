struct Info { const char* id; const char* shape; int d, sq, sk, nb, causal, lse; float scale; int bf16; };
