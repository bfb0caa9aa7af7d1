//! Lists the SQL files of `migrations/` for `src/migrate.rs`, which compiles them in:
//! the work of sqlx's `migrate!` macro, without making every build of this library (and
//! of its users) compile sqlx's macros.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo")).join("migrations");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for path in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name");
        // `0001_create_jobs.sql`: version 1, description "create jobs", as sqlx reads it.
        let (version, description) = name
            .split_once('_')
            .unwrap_or_else(|| panic!("{name}.sql: a migration is named VERSION_DESCRIPTION.sql"));
        let version: i64 = version
            .parse()
            .unwrap_or_else(|_| panic!("{name}.sql: the version `{version}` is not a number"));
        let path = path.canonicalize().expect("a migration's path");
        writeln!(
            out,
            "    ({version}, {:?}, include_str!({:?})),",
            description.replace('_', " "),
            path.display().to_string()
        )
        .expect("writing to a string");
    }
    out.push(']');
    let target = Path::new(&std::env::var("OUT_DIR").expect("set by cargo")).join("migrations.rs");
    std::fs::write(&target, out).expect("writing the list of migrations");
}
