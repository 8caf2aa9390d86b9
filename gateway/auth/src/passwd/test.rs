//! Password file tests: argon2id PHC hashes, parsing with line numbers, and the atomic,
//! mode-0600 rewrite behind `tern passwd`, on real files in a temp directory and through the
//! power-cut simulator.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tern-passwd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn hashes_are_argon2id_phc_strings_that_verify() {
    let hash = hash_password("s3cret").expect("hashes");
    assert!(hash.starts_with("$argon2id$v=19$m=7168,t=5,p=1$"), "{hash}");
    assert!(verify_password(&hash, "s3cret"));
    assert!(!verify_password(&hash, "s3cret "));
    assert!(!verify_password("not a hash", "s3cret"));
    assert_ne!(hash_password("s3cret").expect("hashes"), hash, "fresh salt");
}

#[test]
fn parse_keeps_comments_and_names_bad_lines() {
    let hash = hash_password("pw").expect("hashes");
    let text = format!("# users\n\nalice:{hash}\n");
    let file = PasswordFile::parse(&text, Path::new("p")).expect("parses");
    assert_eq!(file.render(), text);
    assert_eq!(file.users().get("alice").map(|s| &s.hash), Some(&hash));
    assert!(
        file.users()["alice"].scram.is_empty(),
        "a line of an older tern"
    );
    let cases = [
        format!("# c\nbob {hash}\n"),
        "bob:$md5$abc\n".to_owned(),
        format!("a:{hash}\na:{hash}\n"),
        "a:$argon2id$v=19$m=1048576,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\n".to_owned(),
        format!("a:{hash}:$scram-sha-256$i=4096$AA==$AA==$AA==\n"),
        format!("a:{hash}:\n"),
    ];
    for (text, line) in cases.iter().zip([2, 1, 2, 1, 1, 1]) {
        let err = PasswordFile::parse(text, Path::new("p")).expect_err(text);
        assert!(err.to_string().starts_with(&format!("p:{line}:")), "{err}");
    }
}

#[test]
fn update_creates_replaces_and_deletes_with_mode_0600() {
    let dir = temp_dir("update");
    let path = dir.join("passwd");
    update(&path, "alice", Some("one")).expect("creates");
    update(&path, "bob", Some("two")).expect("adds");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).expect("reads");
    std::fs::write(&path, format!("# kept\n{text}")).expect("writes");
    update(&path, "alice", Some("three")).expect("replaces");
    let file = PasswordFile::load(&path).expect("loads");
    let users = file.users();
    assert!(verify_password(&users["alice"].hash, "three"));
    assert!(verify_password(&users["bob"].hash, "two"));
    assert!(file.render().starts_with("# kept\nalice:"));
    update(&path, "alice", None).expect("deletes");
    assert!(
        !PasswordFile::load(&path)
            .expect("loads")
            .users()
            .contains_key("alice")
    );
    let err = update(&path, "alice", None).expect_err("gone");
    assert!(matches!(err, PasswdError::NoSuchUser { .. }), "{err}");
    let leftovers: Vec<_> = std::fs::read_dir(&dir).expect("lists").collect();
    assert_eq!(leftovers.len(), 1, "no temp files left");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rewrite_keeps_the_existing_files_owner_group_and_mode() {
    use std::os::unix::fs::MetadataExt;
    let dir = temp_dir("keep");
    let path = dir.join("passwd");
    update(&path, "alice", Some("one")).expect("creates");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let created = std::fs::metadata(&path).expect("stat");
    // As root (a packaged gateway), hand the file to another owner and group as the package
    // does (root:tern); otherwise keep our own, which fchown accepts too.
    let (uid, gid) = if created.uid() == 0 {
        (65_534, 65_534)
    } else {
        (created.uid(), created.gid())
    };
    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
    update(&path, "bob", Some("two")).expect("adds");
    let after = std::fs::metadata(&path).expect("stat");
    assert_eq!(after.permissions().mode() & 0o7777, 0o640);
    assert_eq!((after.uid(), after.gid()), (uid, gid));
    assert!(
        PasswordFile::load(&path)
            .expect("loads")
            .users()
            .contains_key("bob")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_users_and_passwords_are_refused() {
    let dir = temp_dir("bad");
    let path = dir.join("passwd");
    for user in ["", "a:b", "a b", "a\u{7}"] {
        let err = update(&path, user, Some("pw")).expect_err(user);
        assert!(matches!(err, PasswdError::BadUser { .. }), "{err}");
    }
    let err = update(&path, "alice", Some("")).expect_err("empty");
    assert!(matches!(err, PasswdError::BadPassword { .. }), "{err}");
    assert!(!path.exists(), "nothing written on errors");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn set_passwords_carry_both_scram_credentials_that_match() {
    use crate::scram::{ScramCredential, ScramMechanism};
    let dir = temp_dir("scram");
    let path = dir.join("passwd");
    update(&path, "alice", Some("wonderland")).expect("creates");
    let text = std::fs::read_to_string(&path).expect("reads");
    let fields: Vec<&str> = text.trim_end().split(':').collect();
    assert_eq!(fields.len(), 4, "{text}");
    assert!(fields[2].starts_with("$scram-sha-256$i=4096$"), "{text}");
    assert!(fields[3].starts_with("$scram-sha-512$i=4096$"), "{text}");
    let users = PasswordFile::load(&path).expect("loads").users();
    for mechanism in ScramMechanism::ALL {
        let stored = users["alice"].scram(mechanism).expect("stored").clone();
        let again = ScramCredential::derive(mechanism, "wonderland", stored.salt.clone(), 4096);
        assert_eq!(again, stored, "{}", mechanism.name());
        let wrong = ScramCredential::derive(mechanism, "wonderlanD", stored.salt.clone(), 4096);
        assert_ne!(wrong, stored);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tern passwd` through the power-cut simulator: the power cut at every operation of a
/// rewrite, with each crash mode, leaves the old file or the new one, both of which parse.
#[test]
fn a_power_cut_during_a_rewrite_leaves_the_old_file_or_the_new_one() {
    use tern_core::fs::{CrashMode, FaultyFs};
    let path = Path::new("/etc/tern/passwd");
    let old = {
        let fs = FaultyFs::new(0);
        fs.create_dir_all(Path::new("/etc/tern")).expect("mkdir");
        update_on(&fs, path, "alice", Some("one")).expect("creates");
        PasswordFile::load_from(&fs, path).expect("loads")
    };
    let setup = |seed| {
        let fs = FaultyFs::new(seed);
        fs.create_dir_all(Path::new("/etc/tern")).expect("mkdir");
        old.save(&fs, path).expect("the old file");
        fs
    };
    let mut new = old.clone();
    new.set("bob", Secrets::new("two").expect("hashes"))
        .expect("bob");
    let ops = {
        let fs = setup(0);
        let before = fs.ops();
        new.save(&fs, path).expect("saves");
        fs.ops() - before
    };
    let (mut kept, mut replaced) = (0, 0);
    for mode in [
        CrashMode::DropUnsynced,
        CrashMode::TearLastWrite,
        CrashMode::FlipBit,
    ] {
        for cut in 0..=ops {
            let fs = setup(cut);
            fs.fail_after(cut);
            let saved = new.save(&fs, path).is_ok();
            fs.crash(mode);
            let found = PasswordFile::load_from(&fs, path)
                .unwrap_or_else(|err| panic!("{mode:?}, cut after {cut}: {err}"));
            if saved {
                assert_eq!(found, new, "{mode:?}, cut after {cut}: acknowledged");
                replaced += 1;
            } else {
                assert!(found == old || found == new, "{mode:?}, cut after {cut}");
                kept += usize::from(found == old);
            }
        }
    }
    assert!(kept > 0 && replaced > 0, "kept {kept}, replaced {replaced}");
}
