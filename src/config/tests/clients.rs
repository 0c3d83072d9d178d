//! `[[clients]]` (what a uid may name) and `server.max_connections_per_uid`:
//! read, located mistakes with the class most likely meant, and what
//! `check-config` shows.

use super::*;

const CLASSES: &str = "[[priorities]]\nname = \"interactive\"\n\
                       [[priorities]]\nname = \"batch\"\n";

#[test]
fn config_clients_and_the_per_uid_cap_are_read() {
    let config = parse_ok(&format!(
        "[server]\nmax_connections_per_uid = 64\n{CLASSES}\
         [[clients]]\nuids = [1001, 1002]\ntenants = [\"acme\"]\npriorities = [\"batch\"]\n\
         [[clients]]\nother_uids = true\npriorities = [\"batch\"]\n"
    ));
    assert_eq!(config.server.max_connections_per_uid, Some(64));
    let listed = ClientPolicy {
        uids: vec![1001, 1002],
        other_uids: false,
        tenants: Some(vec!["acme".into()]),
        priorities: Some(vec!["batch".into()]),
    };
    let others = ClientPolicy {
        uids: Vec::new(),
        other_uids: true,
        tenants: None,
        priorities: Some(vec!["batch".into()]),
    };
    assert_eq!(config.clients, vec![listed.clone(), others.clone()]);
    assert_eq!(config.client_policy(Some(1002)), Some(&listed));
    assert_eq!(config.client_policy(Some(7)), Some(&others));
    assert_eq!(config.client_policy(None), Some(&others));

    // Without an `other_uids` entry, a uid not listed is unrestricted.
    let open = parse_ok("[[clients]]\nuids = [1001]\ntenants = [\"acme\"]\n");
    assert_eq!(open.client_policy(Some(7)), None);
    assert_eq!(parse_ok("").server.max_connections_per_uid, None);
    assert!(parse_ok("").clients.is_empty());
}

#[test]
fn config_client_mistakes_are_located_with_the_class_meant() {
    for (text, expected) in [
        (
            format!("{CLASSES}[[clients]]\nuids = [1]\npriorities = [\"bach\"]\n"),
            "test.toml:7:15: clients[0]: priorities names \"bach\", which is not a declared \
             priority class (declared: \"interactive\", \"batch\"); did you mean \"batch\"?",
        ),
        (
            "[[clients]]\nuids = [1]\npriorities = [\"defualt\"]\n".to_string(),
            "test.toml:3:15: clients[0]: priorities names \"defualt\", which is not a declared \
             priority class (no [[priorities]] are declared; the only class is the implicit \
             \"default\"); did you mean \"default\"?",
        ),
        (
            "[[clients]]\ntenants = [\"acme\"]\n".to_string(),
            "test.toml:1:1: clients[0]: uids is required (or other_uids = true, for every uid \
             no entry lists)",
        ),
        (
            "[[clients]]\nuids = [1]\nother_uids = true\n".to_string(),
            "test.toml:2:8: clients[0]: uids and other_uids = true exclude each other \
             (other_uids is the entry of every uid no entry lists)",
        ),
        (
            "[[clients]]\nuids = [1, -1]\n".to_string(),
            "test.toml:2:12: clients[0]: uids[1] must not be negative (got -1)",
        ),
        (
            "[[clients]]\nuids = [5]\n[[clients]]\nuids = [6, 5]\n".to_string(),
            "test.toml:4:12: clients[1]: uid 5 is already listed by clients[0]",
        ),
        (
            "[[clients]]\nuids = [5]\ntenants = []\n".to_string(),
            "test.toml:3:11: clients[0]: tenants is empty, so its uids could acquire nothing \
             (an acquire must name one of the tenants listed; omit tenants to allow any)",
        ),
        (
            "[[clients]]\nuids = [5]\ntenant = [\"acme\"]\n".to_string(),
            "test.toml:3:1: clients[0]: unknown key `tenant`, did you mean `tenants`?",
        ),
        (
            "[server]\nmax_connections_per_uid = 0\n".to_string(),
            "test.toml:2:27: server: max_connections_per_uid must be greater than zero (got 0)",
        ),
    ] {
        assert_eq!(parse_err(&text), expected, "{text}");
    }
}

#[test]
fn config_clients_show_in_the_effective_file_and_read_back() {
    let config = parse_ok(&format!(
        "[server]\nmax_connections_per_uid = 8\n{CLASSES}\
         [[clients]]\nuids = [1001]\ntenants = [\"acme\"]\n\
         [[clients]]\nother_uids = true\npriorities = [\"batch\"]\n"
    ));
    let shown = config.to_effective_toml();
    assert!(shown.contains("max_connections_per_uid = 8"), "{shown}");
    assert!(shown.contains("[[clients]]"), "{shown}");
    assert_eq!(parse_ok(&shown), config, "{shown}");
}
