//! Attribution of guest instructions to functions (`tern-bench icount --symbols N`): the
//! plugin's block file (`FILE COUNT OFFSET...` per translated block, `plugin.rs`) becomes a
//! count per file offset, each offset a function of the file it was mapped from. The file's
//! loadable segments (`readelf -lW`) turn a file offset into an address and its symbol table
//! (the architecture's `nm`; the dynamic one when the file is stripped) into the function at or
//! before it. A stripped library names only its exported functions, so its internal ones count
//! under the exported function before them.
//!
//! Per message, as for the totals: a function's count in the run of 2N messages less its count
//! in the run of N, over N. Reads files and runs binutils; never touches a process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::Arch;
use crate::BenchError;

/// Instructions executed per file offset, per file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Blocks {
    pub per_file: HashMap<String, HashMap<u64, u64>>,
}

impl Blocks {
    /// Parses the plugin's block file.
    pub fn read(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::File {
            op: "reading the block counts",
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).ok_or_else(|| BenchError::Parse {
            path: path.to_path_buf(),
        })
    }

    fn parse(text: &str) -> Option<Self> {
        let mut blocks = Self::default();
        for line in text.lines().filter(|line| !line.is_empty()) {
            let mut fields = line.split(' ');
            let file = fields.next()?;
            let execs: u64 = fields.next()?.parse().ok()?;
            let offsets = blocks.per_file.entry(file.to_owned()).or_default();
            for offset in fields {
                let offset = u64::from_str_radix(offset, 16).ok()?;
                *offsets.entry(offset).or_default() += execs;
            }
        }
        Some(blocks)
    }
}

/// One function's share of the work per message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Share {
    pub function: String,
    /// The file's name (without its directory).
    pub file: String,
    pub insns_per_message: f64,
}

/// Functions by instructions per message, most first: (long − short) / messages per function.
pub fn per_message(
    arch: Arch,
    short: &Blocks,
    long: &Blocks,
    messages: u64,
) -> Result<Vec<Share>, BenchError> {
    let mut files: Vec<&String> = short.per_file.keys().chain(long.per_file.keys()).collect();
    files.sort();
    files.dedup();
    let mut totals: HashMap<(String, String), i128> = HashMap::new();
    for file in files {
        let symbols = Symbols::load(arch, Path::new(file))?;
        let name = file.rsplit('/').next().unwrap_or(file).to_owned();
        let mut add = |blocks: &Blocks, sign: i128| {
            for (&offset, &count) in blocks.per_file.get(file).into_iter().flatten() {
                let function = symbols.function_at(offset).to_owned();
                *totals.entry((function, name.clone())).or_default() += sign * i128::from(count);
            }
        };
        add(long, 1);
        add(short, -1);
    }
    let mut shares: Vec<Share> = totals
        .into_iter()
        .map(|((function, file), insns)| Share {
            function,
            file,
            insns_per_message: insns as f64 / messages.max(1) as f64,
        })
        .collect();
    shares.sort_by(|a, b| b.insns_per_message.total_cmp(&a.insns_per_message));
    Ok(shares)
}

/// The functions of `exe` that ran in any of `runs`, by their symbol names (mangled, as the
/// linker knows them), most instructions first: a symbol ordering file for `ld.lld`. Names
/// the runs never reached are left out.
pub fn executed(arch: Arch, exe: &Path, runs: &[&Blocks]) -> Result<Vec<String>, BenchError> {
    let symbols = Symbols::load_named(arch, exe, false)?;
    let same = |file: &str| {
        let file = Path::new(file);
        file == exe || file.canonicalize().ok() == exe.canonicalize().ok()
    };
    Ok(order(&symbols, same, runs))
}

/// [`executed`] with the symbols loaded and `same` telling the file's name in the runs.
fn order(symbols: &Symbols, same: impl Fn(&str) -> bool, runs: &[&Blocks]) -> Vec<String> {
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for blocks in runs {
        let files = blocks.per_file.iter().filter(|(file, _)| same(file));
        for (&offset, &count) in files.flat_map(|(_, offsets)| offsets) {
            *totals.entry(symbols.function_at(offset)).or_default() += count;
        }
    }
    totals.remove("?");
    let mut order: Vec<(&str, u64)> = totals.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    order.into_iter().map(|(name, _)| name.to_owned()).collect()
}

/// A file's loadable segments and functions.
#[derive(Debug, Default)]
struct Symbols {
    /// (file offset, address, bytes) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    /// (address, name), sorted by address.
    functions: Vec<(u64, String)>,
}

impl Symbols {
    /// The segments and functions of `file`; a file that cannot be read (QEMU's own `?`) has
    /// none, and its instructions count as `?`.
    fn load(arch: Arch, file: &Path) -> Result<Self, BenchError> {
        Self::load_named(arch, file, true)
    }

    /// [`Symbols::load`] with the names demangled or as the linker knows them.
    fn load_named(arch: Arch, file: &Path, demangled: bool) -> Result<Self, BenchError> {
        if !file.is_file() {
            return Ok(Self::default());
        }
        let segments = parse_segments(&tool_output(
            Command::new("readelf").arg("-lW").arg(file),
            "readelf",
        )?);
        let nm = arch.cross_tool("nm");
        let mut functions = Vec::new();
        for dynamic in [false, true] {
            let mut command = Command::new(&nm);
            command.arg("--defined-only");
            if demangled {
                command.arg("-C");
            }
            if dynamic {
                command.arg("-D");
            }
            // A stripped file makes nm fail ("no symbols"): then the dynamic table.
            if let Ok(text) = tool_output(command.arg(file), &nm) {
                functions = parse_functions(&text, arch);
            }
            if !functions.is_empty() {
                break;
            }
        }
        Ok(Self {
            segments,
            functions,
        })
    }

    /// The function holding the instruction at file offset `offset`, or `?`.
    fn function_at(&self, offset: u64) -> &str {
        let address = self
            .segments
            .iter()
            .find(|(start, _, len)| (*start..start.saturating_add(*len)).contains(&offset))
            .map(|(start, address, _)| offset - start + address);
        let Some(address) = address else {
            return "?";
        };
        match self.functions.partition_point(|(at, _)| *at <= address) {
            0 => "?",
            i => self.functions.get(i - 1).map_or("?", |(_, name)| name),
        }
    }
}

/// `LOAD` lines of `readelf -lW`: offset, virtual address and file size.
fn parse_segments(text: &str) -> Vec<(u64, u64, u64)> {
    let hex = |field: &str| u64::from_str_radix(field.trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                ["LOAD", offset, address, _, size, ..] => {
                    Some((hex(offset)?, hex(address)?, hex(size)?))
                }
                _ => None,
            }
        })
        .collect()
}

/// Code symbols of `nm` (types t, T, w, W, i), sorted by address; ARM's mapping symbols (`$a`,
/// `$t`, `$d`) are not functions, and a Thumb function's address loses its low bit.
fn parse_functions(text: &str, arch: Arch) -> Vec<(u64, String)> {
    let mut functions: Vec<(u64, String)> = text
        .lines()
        .filter_map(|line| {
            let (address, rest) = line.split_once(' ')?;
            let (kind, name) = rest.split_once(' ')?;
            let code = matches!(kind, "t" | "T" | "w" | "W" | "i");
            let address = u64::from_str_radix(address, 16).ok()?;
            let address = match arch {
                Arch::Armv7 => address & !1,
                Arch::Aarch64 => address,
            };
            (code && !name.starts_with('$')).then(|| (address, name.to_owned()))
        })
        .collect();
    functions.sort();
    functions.dedup_by_key(|(address, _)| *address);
    functions
}

fn tool_output(command: &mut Command, program: &str) -> Result<String, BenchError> {
    let output = command.output().map_err(|err| BenchError::Tool {
        program: program.to_owned(),
        message: err.to_string(),
    })?;
    if !output.status.success() {
        return Err(BenchError::Tool {
            program: program.to_owned(),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The unstripped twin of the release `tern` (profile `release-symbols`: the same code, its
/// symbols kept) under `cross_dir`.
pub fn unstripped(cross_dir: &Path, arch: Arch) -> PathBuf {
    cross_dir.join(arch.triple()).join("release-symbols/tern")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_add_up_per_offset_across_translations() {
        let blocks = Blocks::parse("/bin/x 3 10 14 18\n/bin/x 2 14\n? 1 400\n").expect("parses");
        let x = &blocks.per_file["/bin/x"];
        assert_eq!((x[&0x10], x[&0x14], x[&0x18]), (3, 5, 3));
        assert_eq!(blocks.per_file["?"][&0x400], 1);
        assert!(Blocks::parse("/bin/x three 10\n").is_none());
    }

    #[test]
    fn offsets_map_through_segments_to_the_function_before_them() {
        let segments = parse_segments(
            "  LOAD           0x000000 0x0000000000000000 0x0000000000000000 0x001000 0x001000 R   0x10000\n\
             \x20 LOAD           0x001000 0x0000000000011000 0x0000000000011000 0x002000 0x002000 R E 0x10000\n",
        );
        assert_eq!(segments, [(0, 0, 0x1000), (0x1000, 0x11000, 0x2000)]);
        let functions = parse_functions(
            "0000000000011000 T main\n0000000000011101 t thumb_fn\n0000000000011200 t $a\n\
             0000000000012000 D data\n",
            Arch::Armv7,
        );
        assert_eq!(
            functions,
            [
                (0x11000, "main".to_owned()),
                (0x11100, "thumb_fn".to_owned())
            ]
        );
        let symbols = Symbols {
            segments,
            functions,
        };
        assert_eq!(symbols.function_at(0x1004), "main");
        assert_eq!(symbols.function_at(0x1100), "thumb_fn");
        assert_eq!(symbols.function_at(0x5000), "?");
    }

    #[test]
    fn the_link_order_lists_the_executed_functions_of_the_file_most_first() {
        let symbols = Symbols {
            segments: vec![(0x1000, 0x11000, 0x2000)],
            functions: vec![
                (0x11000, "_RNvCs1_4tern4main".to_owned()),
                (0x11100, "_RNvCs1_4tern3hot".to_owned()),
                (0x11200, "_RNvCs1_4tern5never".to_owned()),
            ],
        };
        let short =
            Blocks::parse("/x/tern 1 1004 1008\n/x/tern 50 1100\n/lib/libc.so.6 900 1100\n")
                .expect("parses");
        let long =
            Blocks::parse("/x/tern 1 1004\n/x/tern 100 1104\n/x/tern 3 9000\n").expect("parses");
        let order = order(&symbols, |file| file == "/x/tern", &[&short, &long]);
        // Counted in both runs, libc's blocks and the offsets outside every function left out.
        assert_eq!(order, ["_RNvCs1_4tern3hot", "_RNvCs1_4tern4main"]);
    }

    #[test]
    fn per_message_is_the_difference_of_the_runs() {
        let short = Blocks::parse("? 10 1 2\n").expect("parses");
        let long = Blocks::parse("? 30 1 2\n").expect("parses");
        let shares = per_message(Arch::Aarch64, &short, &long, 10).expect("attributes");
        assert_eq!(shares.len(), 1);
        assert_eq!(shares[0].insns_per_message, 4.0);
        assert_eq!(shares[0].function, "?");
    }
}
