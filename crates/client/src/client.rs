//! [`Client`]: a [`Connection`] in a background task, with RPC futures, a push stream, and
//! automatic reconnect-and-resume with backoff until the server's resume window runs out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tickwire_wire::proto::{Envelope, Push, Response, Status, envelope};
use tokio::sync::{mpsc, oneshot};

use crate::{ClientError, ConnectOptions, Connection, Event};

/// Commands queued for the driver task before it stops taking more (callers then wait).
const COMMAND_QUEUE: usize = 256;
/// Pushes buffered for the application; past this the driver stops reading (backpressure).
const PUSH_QUEUE: usize = 1024;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

enum Command {
    Call { method: String, body: Bytes, reply: oneshot::Sender<Result<Response, ClientError>> },
    Push { topic: String, body: Bytes },
    Close { done: oneshot::Sender<()> },
}

/// A connected client. Cheap to share by reference; calls can run concurrently.
#[derive(Debug)]
pub struct Client {
    commands: mpsc::Sender<Command>,
    pushes: tokio::sync::Mutex<mpsc::Receiver<Push>>,
    player_id: String,
    connection_id: u64,
}

impl Client {
    /// Opens a session and starts the background task.
    pub async fn connect(opts: ConnectOptions) -> Result<Client, ClientError> {
        let conn = Connection::connect(opts).await?;
        let player_id = conn.welcome().player_id.clone();
        let connection_id = conn.welcome().connection_id;
        let (commands, rx) = mpsc::channel(COMMAND_QUEUE);
        let (push_tx, pushes) = mpsc::channel(PUSH_QUEUE);
        tokio::spawn(drive(conn, rx, push_tx));
        Ok(Client { commands, pushes: tokio::sync::Mutex::new(pushes), player_id, connection_id })
    }

    pub fn player_id(&self) -> &str {
        &self.player_id
    }

    /// This session's connection id (Welcome.connection_id): how servers name this client.
    pub fn connection_id(&self) -> u64 {
        self.connection_id
    }

    /// Calls `method` and waits for its response body. A non-OK status is an error.
    /// The call survives reconnects: the request is resent if the link drops.
    pub async fn call(&self, method: &str, body: Bytes) -> Result<Bytes, ClientError> {
        self.queue_call(method, body).await?.answer().await
    }

    /// Queues a call of `method` and returns once it is queued, with its answer to wait for
    /// later (or never: dropping the [`Reply`] only drops the answer). Calls go out in the
    /// order they were queued, so a game server can send a frame's requests and go on with its
    /// next frame without waiting for the gateway to answer the last one. Waits only while the
    /// queue of commands in front of the connection is full.
    pub async fn queue_call(&self, method: &str, body: Bytes) -> Result<Reply, ClientError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Call { method: method.to_owned(), body, reply };
        self.commands.send(cmd).await.map_err(|_| ClientError::Shutdown)?;
        Ok(Reply(rx))
    }

    /// Sends a one-way message.
    pub async fn push(&self, topic: &str, body: Bytes) -> Result<(), ClientError> {
        let cmd = Command::Push { topic: topic.to_owned(), body };
        self.commands.send(cmd).await.map_err(|_| ClientError::Shutdown)
    }

    /// The next push from the server; `None` once the session has ended. Read them promptly:
    /// with 1,024 waiting, the client stops reading its connection (backpressure), and so sends
    /// no acknowledgements or heartbeats either. A session left unread that long is closed by
    /// the gateway as a slow consumer, or its connection dropped after the read timeout (and
    /// resumed once pushes are read again).
    pub async fn next_push(&self) -> Option<Push> {
        self.pushes.lock().await.recv().await
    }

    /// Ends the session cleanly.
    pub async fn close(self) {
        let (done, rx) = oneshot::channel();
        if self.commands.send(Command::Close { done }).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// The answer to a call queued with [`Client::queue_call`].
#[derive(Debug)]
pub struct Reply(oneshot::Receiver<Result<Response, ClientError>>);

impl Reply {
    /// The response body; a non-OK status is an error, as for [`Client::call`].
    pub async fn answer(self) -> Result<Bytes, ClientError> {
        response_body(self.0.await.map_err(|_| ClientError::Shutdown)??)
    }
}

/// A response's body, or its status as an error unless OK: how [`Client::call`] reads an
/// answer, for code that reads [`Connection`] events itself.
pub fn response_body(response: Response) -> Result<Bytes, ClientError> {
    match response.status() {
        Status::Ok => Ok(response.body),
        status => Err(ClientError::Status { status, message: response.error }),
    }
}

struct Driver {
    conn: Connection,
    next_id: u64,
    pending: HashMap<u64, oneshot::Sender<Result<Response, ClientError>>>,
    pushes: mpsc::Sender<Push>,
}

async fn drive(conn: Connection, mut commands: mpsc::Receiver<Command>, pushes: mpsc::Sender<Push>) {
    let mut driver = Driver { conn, next_id: 1, pending: HashMap::new(), pushes };
    let end = loop {
        driver.conn.flush().await;
        let step = tokio::select! {
            cmd = commands.recv() => match cmd {
                Some(Command::Close { done }) => {
                    driver.conn.close().await;
                    let _ = done.send(());
                    return;
                }
                Some(cmd) => driver.on_command(cmd),
                None => {
                    driver.conn.close().await;
                    return;
                }
            },
            event = driver.conn.next_event() => match event {
                Ok(Some(event)) => driver.on_event(event).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = step {
            break e;
        }
    };
    tracing::debug!(error = %end, "client session ended");
    let reason = end.to_string();
    for (_, reply) in driver.pending.drain() {
        let _ = reply.send(Err(ClientError::Protocol(format!("session ended: {reason}"))));
    }
}

impl Driver {
    fn on_command(&mut self, cmd: Command) -> Result<(), ClientError> {
        match cmd {
            Command::Call { method, body, reply } => {
                let id = self.next_id;
                self.next_id += 1;
                match self.conn.send_request(id, &method, body) {
                    Ok(()) => {
                        self.pending.insert(id, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
                Ok(())
            }
            Command::Push { topic, body } => {
                let push = Push { topic, body };
                self.conn.send(&Envelope { kind: Some(envelope::Kind::Push(push)) })
            }
            Command::Close { .. } => Ok(()),
        }
    }

    async fn on_event(&mut self, event: Event) -> Result<(), ClientError> {
        match event {
            Event::Response(response) => {
                if let Some(reply) = self.pending.remove(&response.id) {
                    let _ = reply.send(Ok(response));
                }
                Ok(())
            }
            Event::Push(push) => {
                // Backpressure: while the application is not reading pushes, neither do we.
                let _ = self.pushes.send(push).await;
                Ok(())
            }
            Event::Request(_) => {
                Err(ClientError::Protocol("servers may not send requests to clients".into()))
            }
            Event::Closed { reason, message } => Err(ClientError::Closed { reason, message }),
            Event::LinkLost => self.reconnect().await,
        }
    }

    /// Retries the resume with exponential backoff until the resume window is over.
    async fn reconnect(&mut self) -> Result<(), ClientError> {
        let window = Duration::from_millis(u64::from(self.conn.welcome().resume_window_ms));
        let give_up = Instant::now() + window;
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.conn.resume().await {
                Ok(()) => return Ok(()),
                Err(e @ ClientError::Closed { .. }) if !e.is_retryable() => return Err(e),
                Err(e) if Instant::now() + backoff >= give_up => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "resume failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}
