//! `eqfuse run PROG --cpu`: run a program on the CPU reference with `.npy` files in and out.
//!
//! Each input `NAME` is read from `INPUTS/NAME.npy` when that file exists; otherwise it is the
//! value the program carries (an ONNX initializer, [`Program::values`]), if any; otherwise it is
//! drawn from the seeded generator. Every input, loaded or generated, is saved as `OUTPUTS/NAME.npy`
//! beside the outputs (`OUTPUTS/NAME.npy` too), so the output folder holds a complete run and
//! pointing `--inputs` at it repeats the run exactly.
//! An input file that is there but is not a regular file (a folder, a device) is an error, never
//! replaced by generated values.
//! Invariant: nothing is written until every input is loaded and the program has evaluated, and
//! then every file is written under a temporary name and renamed into place only when all are
//! written ([`write_all`]), so a failed run leaves no half-written output folder behind.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::ir::program::Program;
use crate::ir::tensor::{Summary, Tensor};
use crate::ir::types::TensorType;
use crate::reference::eval;
use crate::reference::npy::{read_npy, write_file};
use crate::reference::rng::random_program_input;

/// Where outputs go when no folder is given.
pub const DEFAULT_OUTPUTS_DIR: &str = "eqfuse-out";

/// Options of a CPU run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuRunOptions {
    /// Folder holding `NAME.npy` for some or all inputs.
    pub inputs_dir: Option<PathBuf>,
    /// Folder for outputs and generated inputs; `./eqfuse-out` when `None`.
    pub outputs_dir: Option<PathBuf>,
    /// Seed of generated inputs.
    pub seed: u64,
}

/// Where an input's values came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputSource {
    /// Read from this file.
    Loaded(PathBuf),
    /// The value the program carries (an ONNX initializer).
    Program,
    /// Drawn from the seeded generator.
    Generated,
}

/// One input of a run.
#[derive(Clone, Debug)]
pub struct InputReport {
    pub name: String,
    pub source: InputSource,
    /// Where the run saved it (beside the outputs).
    pub saved: PathBuf,
    pub value: Tensor,
}

/// One output of a run.
#[derive(Clone, Debug)]
pub struct OutputReport {
    pub name: String,
    pub path: PathBuf,
    pub summary: Summary,
    pub value: Tensor,
}

/// What a CPU run did, for the terminal (`Display`) and for callers that compare values.
#[derive(Clone, Debug)]
pub struct CpuRunReport {
    pub program: String,
    pub seed: u64,
    pub outputs_dir: PathBuf,
    pub inputs: Vec<InputReport>,
    pub outputs: Vec<OutputReport>,
}

/// Loads or generates the inputs, evaluates `program` on the reference, and writes the outputs.
pub fn run_cpu(program: &Program, opts: &CpuRunOptions) -> Result<CpuRunReport> {
    let outputs_dir = opts.outputs_dir.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUTS_DIR));
    check_names(program)?;
    check_run_folders(opts.inputs_dir.as_deref(), Some(&outputs_dir))?;
    crate::reference::check_fits(program)?;
    let inputs = gather_inputs(program, opts, &outputs_dir)?;
    let by_name: HashMap<String, Tensor> = inputs.iter().map(|i| (i.name.clone(), i.value.clone())).collect();
    let values = eval(program, &by_name)?;
    let outputs: Vec<OutputReport> = program
        .outputs
        .iter()
        .zip(values)
        .map(|(o, value)| {
            let path = npy_path(&outputs_dir, &o.name);
            OutputReport { name: o.name.clone(), path, summary: value.summary(), value }
        })
        .collect();
    let files = inputs
        .iter()
        .filter(|i| i.source != InputSource::Loaded(i.saved.clone()))
        .map(|i| (i.saved.clone(), &i.value))
        .chain(outputs.iter().map(|o| (o.path.clone(), &o.value)));
    write_all(&outputs_dir, &files.collect::<Vec<_>>())?;
    Ok(CpuRunReport { program: program.source.clone(), seed: opts.seed, outputs_dir, inputs, outputs })
}

/// Checks a run's folders before anything is computed: `inputs` (`--inputs`), when given, must
/// be a folder; `outputs` (`--outputs`) a folder or nothing yet.
pub fn check_run_folders(inputs: Option<&Path>, outputs: Option<&Path>) -> Result<()> {
    if let Some(dir) = inputs {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Invalid(format!(
                    "{}: the inputs folder is a file, not a folder (--inputs names a folder of NAME.npy files)",
                    dir.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Invalid(format!("{}: the inputs folder does not exist", dir.display())))
            }
            Err(e) => return Err(Error::io(dir.display().to_string(), e)),
        }
    }
    let Some(outputs) = outputs else { return Ok(()) };
    match std::fs::metadata(outputs) {
        Ok(m) if !m.is_dir() => Err(Error::Invalid(format!(
            "{}: the outputs folder is a file, not a folder (--outputs names a folder)",
            outputs.display()
        ))),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(outputs.display().to_string(), e)),
        _ => Ok(()),
    }
}

/// `DIR/NAME.npy` of input `name` when there is a file at that path (or a link to one); `None`
/// when there is nothing there (the input is generated); an error when something else is there
/// (a folder, a device such as `/dev/zero`, a broken link): it is never silently replaced.
pub(crate) fn input_file(dir: &Path, name: &str) -> Result<Option<PathBuf>> {
    let path = npy_path(dir, name);
    let shown = path.display().to_string();
    match std::fs::metadata(&path) {
        Ok(m) if crate::files::is_readable_kind(&m) => Ok(Some(path)),
        Ok(m) => {
            let what = if m.is_dir() { "a folder" } else { "a device or other special file" };
            Err(Error::Invalid(format!("{shown}: input `{name}` is {what}, not a .npy file")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(&path).is_ok() {
                Err(Error::Invalid(format!("{shown}: input `{name}` is a link to nothing")))
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(Error::io(shown, e)),
    }
}

/// Writes every file or none: each goes to a temporary name beside its place first, and only
/// when all are written are they renamed into place (a failed write removes the temporary files
/// and leaves the folder as it was). Creates `dir`.
pub(crate) fn write_all(dir: &Path, files: &[(PathBuf, &Tensor)]) -> Result<()> {
    // A folder in a file's place would make its rename fail after others were done.
    if let Some((p, _)) = files.iter().find(|(p, _)| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())) {
        return Err(Error::Invalid(format!("{}: a folder is in the way of the file the run writes", p.display())));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
    let temp = |p: &Path| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        p.with_file_name(format!(".{name}.{}.partial", std::process::id()))
    };
    let mut written: Vec<PathBuf> = Vec::with_capacity(files.len());
    let cleanup = |written: &[PathBuf]| {
        for t in written {
            let _ = std::fs::remove_file(t);
        }
    };
    for (path, value) in files {
        let t = temp(path);
        // Already under a temporary name: written in place, errors naming the file asked for.
        if let Err(e) = write_file(&t, &path.display().to_string(), value) {
            let _ = std::fs::remove_file(&t);
            cleanup(&written);
            return Err(e);
        }
        written.push(t);
    }
    for (i, (path, _)) in files.iter().enumerate() {
        if let Err(e) = std::fs::rename(&written[i], path) {
            cleanup(&written[i..]);
            return Err(Error::io(path.display().to_string(), e));
        }
    }
    Ok(())
}

fn npy_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.npy"))
}

/// An output that shares a name with a different input would overwrite that input's file.
pub(crate) fn check_names(program: &Program) -> Result<()> {
    for o in &program.outputs {
        if let Some(i) = program.input(&o.name).filter(|i| i.id != o.id) {
            return Err(Error::Invalid(format!(
                "output `{}` and input `{}` would both be saved as {}.npy",
                o.name, i.name, o.name
            )));
        }
    }
    Ok(())
}

fn gather_inputs(program: &Program, opts: &CpuRunOptions, outputs_dir: &Path) -> Result<Vec<InputReport>> {
    let mut reports = Vec::with_capacity(program.inputs.len());
    for (k, input) in program.inputs.iter().enumerate() {
        let file = match &opts.inputs_dir {
            Some(d) => input_file(d, &input.name)?,
            None => None,
        };
        let (source, value) = match file {
            Some(path) => {
                let value = read_npy(&path, &input.ty)?;
                (InputSource::Loaded(path), value)
            }
            None if program.values.contains_key(&input.name) => {
                (InputSource::Program, random_program_input(program, k, opts.seed))
            }
            None => (InputSource::Generated, random_program_input(program, k, opts.seed)),
        };
        let saved = npy_path(outputs_dir, &input.name);
        reports.push(InputReport { name: input.name.clone(), source, saved, value });
    }
    Ok(reports)
}

impl fmt::Display for CpuRunReport {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(f, "ran {} on the CPU reference (seed {})", self.program, self.seed)?;
        let width = self.inputs.iter().map(|i| i.name.len()).chain(self.outputs.iter().map(|o| o.name.len())).max();
        let width = width.unwrap_or(0);
        let types: Vec<String> = self.inputs.iter().map(|i| ty_of(&i.value)).collect();
        let out_types: Vec<String> = self.outputs.iter().map(|o| ty_of(&o.value)).collect();
        let tw = types.iter().chain(&out_types).map(String::len).max().unwrap_or(0);
        if !self.inputs.is_empty() {
            writeln!(f, "inputs:")?;
        }
        for (i, ty) in self.inputs.iter().zip(&types) {
            let how = match &i.source {
                InputSource::Loaded(p) => format!("loaded from {}", p.display()),
                InputSource::Program => "from the model".to_string(),
                InputSource::Generated => "generated".to_string(),
            };
            writeln!(f, "  {:width$}  {ty:tw$}  {how}, saved to {}", i.name, i.saved.display())?;
        }
        writeln!(f, "outputs:")?;
        for (o, ty) in self.outputs.iter().zip(&out_types) {
            writeln!(f, "  {:width$}  {ty:tw$}  {}  -> {}", o.name, o.summary, o.path.display())?;
        }
        Ok(())
    }
}

fn ty_of(t: &Tensor) -> String {
    TensorType::new(t.dtype, t.shape.clone()).to_string()
}
