"""eqfuse for PyTorch: export `torch.export` programs and ATen fx graphs to eqfuse's JSON graph
(`export.py`), and a `torch.compile` backend that plans captured graphs with the `eqfuse`
binary (`backend.py`). `graph.py` writes the JSON graph and needs no PyTorch.
"""

from .graph import SCHEMA, ExportError, GraphBuilder, Value

__all__ = ["SCHEMA", "ExportError", "GraphBuilder", "Value", "export_program", "export_graph_module", "Exported",
           "eqfuse_backend", "plan_graph"]


def __getattr__(name):
    # PyTorch is imported only when a PyTorch entry point is asked for.
    if name in ("export_program", "export_graph_module", "Exported"):
        from . import export

        return getattr(export, name)
    if name in ("eqfuse_backend", "plan_graph"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(name)
