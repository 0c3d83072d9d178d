//! What a connected client may do, by the uid the kernel gives for it
//! (issue 27, "no worker can hurt the fleet"): the tenants and priority
//! classes its `[[clients]]` entry allows, and its share of the
//! connections (`server.max_connections_per_uid`). A test process has one
//! uid, so each test names its own uid in the daemon's config, or another
//! one to show that a uid no entry lists is unrestricted. Each test failed
//! against the daemon before the policy: it took any tenant and class on
//! the client's word, and any uid could fill every connection.

use crate::support;

use std::time::{Duration, Instant};

use ratekeeper::proto::{
    Acquire, CONNECTION_REQUEST_ID, Cost, ErrorCode, Request, Response, ServerFrame,
};
use support::{Daemon, acquire, error_code, granted, hello, receive, send};
use tokio::net::UnixStream;

/// The uid of this test process, as the daemon sees its connections.
fn my_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Two classes (the default first) and a limit with tenant shares, then
/// `clients`.
fn config_with(clients: &str) -> String {
    format!(
        "default_priority = \"interactive\"\n\
         [[priorities]]\nname = \"interactive\"\n\
         [[priorities]]\nname = \"batch\"\n\
         [[limits]]\nname = \"gpt\"\ntokens_per_minute = 600000\ntenant_share = 0.5\n\
         {clients}"
    )
}

/// An acquire of 10 tokens from `gpt` that waits for nothing.
fn acquire_as(tenant: Option<&str>, priority: Option<&str>) -> Request {
    Request::Acquire(Acquire {
        limit: "gpt".into(),
        tenant: tenant.map(Into::into),
        priority: priority.map(Into::into),
        cost: Cost::Tokens {
            input_tokens: 10,
            output_tokens: 0,
        },
        max_wait_ms: Some(0),
    })
}

/// Sends `request` on a fresh id and returns the answer.
async fn call(stream: &mut UnixStream, request_id: u64, request: Request) -> Response {
    send(stream, request_id, request).await;
    let answer = receive(stream).await.expect("an answer");
    assert_eq!(answer.request_id, request_id, "{answer:?}");
    answer.response
}

/// The message of an `InvalidRequest` refusal, panicking on anything else.
fn refused(response: &Response) -> &str {
    assert_eq!(
        error_code(response),
        ErrorCode::InvalidRequest,
        "{response:?}"
    );
    match response {
        Response::Error { message, .. } => message,
        _ => unreachable!(),
    }
}

/// Issue: any client could name any tenant, drawing that tenant's share,
/// and use any class. Now its uid's entry names what it may use.
#[tokio::test]
async fn a_uid_may_name_only_the_tenants_and_classes_its_entry_allows() {
    let uid = my_uid();
    let daemon = Daemon::start(&config_with(&format!(
        "[[clients]]\nuids = [{uid}]\ntenants = [\"acme\"]\npriorities = [\"batch\"]\n"
    )));
    let mut stream = daemon.raw_after_hello().await;

    granted(&call(&mut stream, 2, acquire_as(Some("acme"), Some("batch"))).await);

    let other_tenant = call(&mut stream, 3, acquire_as(Some("globex"), Some("batch"))).await;
    let message = refused(&other_tenant);
    assert!(
        message.contains(&format!("uid {uid}")) && message.contains("tenant \"globex\""),
        "{message}"
    );
    assert!(
        message.contains("\"acme\""),
        "says what is allowed: {message}"
    );

    let no_tenant = call(&mut stream, 4, acquire_as(None, Some("batch"))).await;
    assert!(refused(&no_tenant).contains("without naming a tenant"));

    let other_class = call(
        &mut stream,
        5,
        acquire_as(Some("acme"), Some("interactive")),
    )
    .await;
    assert!(refused(&other_class).contains("priority class \"interactive\""));

    // Naming no class is using the default one, which the entry does not allow.
    let default_class = call(&mut stream, 6, acquire_as(Some("acme"), None)).await;
    assert!(refused(&default_class).contains("priority class \"interactive\""));

    // A refusal is the request's, not the connection's.
    granted(&call(&mut stream, 7, acquire_as(Some("acme"), Some("batch"))).await);
}

/// A uid no entry lists is unrestricted, unless an `other_uids` entry
/// says what every such uid may use.
#[tokio::test]
async fn a_uid_no_entry_lists_is_unrestricted_unless_other_uids_says_otherwise() {
    let someone_else = my_uid().wrapping_add(1);
    let daemon = Daemon::start(&config_with(&format!(
        "[[clients]]\nuids = [{someone_else}]\ntenants = [\"acme\"]\npriorities = [\"batch\"]\n"
    )));
    let mut stream = daemon.raw_after_hello().await;
    granted(
        &call(
            &mut stream,
            2,
            acquire_as(Some("globex"), Some("interactive")),
        )
        .await,
    );
    granted(&call(&mut stream, 3, acquire_as(None, None)).await);

    let daemon = Daemon::start(&config_with(&format!(
        "[[clients]]\nuids = [{someone_else}]\n\
         [[clients]]\nother_uids = true\npriorities = [\"batch\"]\n"
    )));
    let mut stream = daemon.raw_after_hello().await;
    granted(&call(&mut stream, 2, acquire_as(Some("globex"), Some("batch"))).await);
    let interactive = call(
        &mut stream,
        3,
        acquire_as(Some("globex"), Some("interactive")),
    )
    .await;
    assert!(refused(&interactive).contains("priority class \"interactive\""));
}

/// The policy sits outside `[server]`, so a reload (`SIGHUP`) applies it as
/// it does limits, without a restart.
#[tokio::test]
async fn the_policy_is_applied_by_a_reload() {
    let daemon = Daemon::start(&config_with(""));
    let mut stream = daemon.raw_after_hello().await;
    granted(&call(&mut stream, 2, acquire_as(Some("globex"), None)).await);

    let uid = my_uid();
    let restricted = config_with(&format!(
        "[[clients]]\nuids = [{uid}]\ntenants = [\"acme\"]\n"
    ));
    daemon
        .reload_with(&restricted)
        .await
        .expect("the reload applies");

    let answer = call(&mut stream, 3, acquire_as(Some("globex"), None)).await;
    assert!(refused(&answer).contains("tenant \"globex\""));
    granted(&call(&mut stream, 4, acquire_as(Some("acme"), None)).await);
}

/// A raw connection that has said hello, retried while the daemon's
/// accept queue is full.
async fn connect_with_hello(daemon: &Daemon) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match UnixStream::connect(&daemon.socket).await {
            Ok(mut stream) => {
                send(&mut stream, 1, hello()).await;
                let answer = receive(&mut stream).await.expect("hello answer");
                assert!(
                    matches!(answer.response, Response::Hello { .. }),
                    "{answer:?}"
                );
                return stream;
            }
            Err(error) => assert!(Instant::now() < deadline, "cannot connect: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Whether the daemon closed `stream` without another frame.
async fn closed(stream: &mut UnixStream) -> bool {
    receive(stream).await.is_none()
}

/// Issue: one uid could hold every connection of the daemon. Now at its
/// cap a uid's new connection closes that uid's own idlest, even though
/// the daemon is far below `max_connections`.
#[tokio::test]
async fn a_uid_at_its_cap_loses_its_own_idlest_connection() {
    let daemon = Daemon::start(&config_with(
        "[server]\nmax_connections = 100\nmax_connections_per_uid = 2\n",
    ));
    let mut oldest = connect_with_hello(&daemon).await;
    let mut newer = connect_with_hello(&daemon).await;
    // A frame makes a connection the least idle: `oldest` stays the idlest.
    send(&mut newer, 2, Request::Ping).await;
    assert_eq!(
        receive(&mut newer).await.expect("pong").response,
        Response::Pong
    );

    let mut admitted = connect_with_hello(&daemon).await;
    assert!(
        closed(&mut oldest).await,
        "the uid's idlest connection is closed"
    );
    for stream in [&mut newer, &mut admitted] {
        send(stream, 3, Request::Ping).await;
        assert_eq!(
            receive(stream).await.expect("pong").response,
            Response::Pong
        );
    }
    daemon
        .wait_for_log("connection closed to make room under server.max_connections_per_uid")
        .await;
}

/// With every connection of the uid waiting on an acquire, its next one is
/// refused `Overloaded` on request id 0, as the global cap does.
#[tokio::test]
async fn a_uid_whose_connections_are_all_busy_is_refused_overloaded() {
    let daemon = Daemon::start(
        "[server]\nmax_connections = 100\nmax_connections_per_uid = 2\n\
         [[priorities]]\nname = \"patient\"\nmax_wait_ms = 3600000\n\
         [[limits]]\nname = \"slow\"\ntokens_per_minute = 60\nburst_tokens = 60\n",
    );
    let mut open = vec![
        connect_with_hello(&daemon).await,
        connect_with_hello(&daemon).await,
    ];
    // The bucket's burst, taken; then each connection waits minutes in line.
    send(&mut open[0], 2, acquire("slow", 60, 0)).await;
    granted(
        &receive(&mut open[0])
            .await
            .expect("the burst granted")
            .response,
    );
    for stream in &mut open {
        send(stream, 3, acquire("slow", 60, 3_600_000)).await;
        // In flight once a ping sent after it is answered (frames are read
        // in order).
        send(stream, 4, Request::Ping).await;
        assert_eq!(
            receive(stream).await.expect("pong").response,
            Response::Pong
        );
    }

    let mut beyond = UnixStream::connect(&daemon.socket).await.expect("connect");
    let refusal: ServerFrame = receive(&mut beyond).await.expect("a refusal frame");
    assert_eq!(refusal.request_id, CONNECTION_REQUEST_ID, "{refusal:?}");
    assert_eq!(error_code(&refusal.response), ErrorCode::Overloaded);
    match &refusal.response {
        Response::Error { message, .. } => {
            assert!(message.contains("max_connections_per_uid"), "{message}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(
        closed(&mut beyond).await,
        "the refused connection is closed"
    );

    // One of its connections gone, the uid is served again.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut stream = UnixStream::connect(&daemon.socket).await.expect("connect");
        send(&mut stream, 1, hello()).await;
        match receive(&mut stream).await {
            Some(answer) if matches!(answer.response, Response::Hello { .. }) => break,
            _ => assert!(Instant::now() < deadline, "the uid is never served again"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
