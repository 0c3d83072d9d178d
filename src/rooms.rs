//! The rule of the rooms (the table in `lib.rs`): a module imports only
//! rooms below it, so the crate has no import circle and each room can be
//! read, tested and changed with only what is beneath it in mind.

/// Every room of the crate, from the bottom up: each may name only rooms
/// listed before it.
const ROOMS: &[&str] = &[
    "proto", "metrics", "logging", "systemd", "feedback", "tokens", "budget", "limiter", "leases",
    "config", "plan", "service", "server", "exporter", "client", "app",
];

/// The rooms `source` names as `crate::room`, outside comments.
fn named_rooms(source: &str) -> Vec<String> {
    let mut named = Vec::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let room: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !room.is_empty() {
                named.push(room);
            }
        }
    }
    named
}

#[test]
fn no_room_imports_one_above_it() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.clone()];
    let mut violations = Vec::new();
    let mut seen_rooms = std::collections::BTreeSet::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("src/ is readable") {
                files.push(entry.expect("a directory entry").path());
            }
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let relative = path.strip_prefix(&src).expect("under src/");
        let first = relative.components().next().expect("a first component");
        let room = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // The binary (main.rs, its commands, the load generator) uses the
        // library from outside, as `ratekeeper::`.
        if ["lib", "main", "commands", "bin", "rooms"].contains(&room.as_str()) {
            continue;
        }
        let Some(height) = ROOMS.iter().position(|listed| *listed == room) else {
            violations.push(format!("{} is in no room of ROOMS", relative.display()));
            continue;
        };
        seen_rooms.insert(room.clone());
        let source = std::fs::read_to_string(&path).expect("a readable source file");
        for named in named_rooms(&source) {
            match ROOMS.iter().position(|listed| *listed == named) {
                Some(other) if other < height => {}
                Some(other) if other == height => {}
                Some(_) => violations.push(format!(
                    "{} ({room}) imports {named}, a room above it",
                    relative.display()
                )),
                None => violations.push(format!(
                    "{} names crate::{named}, which ROOMS does not list",
                    relative.display()
                )),
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(seen_rooms.len(), ROOMS.len(), "rooms found: {seen_rooms:?}");
}

#[test]
fn named_rooms_skips_comments() {
    let source = "use crate::proto::Frame; // not crate::app\n//! crate::server\nlet x = crate::limiter::Stores;";
    assert_eq!(named_rooms(source), ["proto", "limiter"]);
}
