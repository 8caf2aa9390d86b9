//! The password verifier: one dedicated thread runs every argon2 verification in one reusable
//! block buffer, so a flood of logins costs one hash's memory (7 MiB with `tern passwd`'s
//! parameters) for the life of the process instead of a fresh allocation on whichever blocking
//! thread comes next (each keeps its freed memory in its own malloc arena). Callers queue
//! behind a semaphore of one, so at most one verification runs and the rest wait without
//! memory of their own. Never logs a password.

use std::sync::mpsc;

use argon2::password_hash::{Output, PasswordHash};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use tokio::sync::{Semaphore, oneshot};

/// A verification: looks up the hash and checks the password, in the verifier's buffer.
type Job = Box<dyn FnOnce(&mut Memory) + Send>;

/// The verifier thread's handle.
#[derive(Debug)]
pub(crate) struct Verifier {
    jobs: mpsc::Sender<Job>,
    turn: Semaphore,
}

impl Verifier {
    /// Starts the thread (named `tern-passwd`).
    pub(crate) fn start() -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("tern-passwd".to_owned())
            .spawn(move || {
                let mut memory = Memory::default();
                for job in queue {
                    job(&mut memory);
                }
            })?;
        Ok(Self {
            jobs,
            turn: Semaphore::new(1),
        })
    }

    /// Runs `check` on the verifier thread once it is this caller's turn; `false` if the
    /// thread is gone.
    pub(crate) async fn run(
        &self,
        check: impl FnOnce(&mut Memory) -> bool + Send + 'static,
    ) -> bool {
        let Ok(_turn) = self.turn.acquire().await else {
            return false;
        };
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |memory| {
            let _ = reply.send(check(memory));
        });
        if self.jobs.send(job).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

/// The argon2 block buffer, grown to the largest memory cost seen and shrunk back to
/// `KEEP_BLOCKS` after a larger one.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    blocks: Vec<Block>,
}

/// Blocks kept between verifications: `tern passwd`'s memory cost (1 KiB per block).
const KEEP_BLOCKS: usize = super::passwd::MEMORY_KIB as usize;

impl Memory {
    /// Whether `password` matches the PHC `hash`, with the hash's own parameters.
    pub(crate) fn verify(&mut self, hash: &str, password: &str) -> bool {
        let Ok(parsed) = PasswordHash::new(hash) else {
            return false;
        };
        let matches = self.compute(&parsed, password.as_bytes());
        if self.blocks.len() > KEEP_BLOCKS {
            self.blocks.truncate(KEEP_BLOCKS);
            self.blocks.shrink_to_fit();
        }
        matches.unwrap_or(false)
    }

    fn compute(&mut self, parsed: &PasswordHash<'_>, password: &[u8]) -> Option<bool> {
        let algorithm = Algorithm::try_from(parsed.algorithm).ok()?;
        let version = match parsed.version {
            Some(v) => Version::try_from(v).ok()?,
            None => Version::default(),
        };
        let params = Params::try_from(parsed).ok()?;
        let expected = parsed.hash?;
        let mut salt = [0u8; 64];
        let salt = parsed.salt?.decode_b64(&mut salt).ok()?;
        let count = params.block_count();
        if self.blocks.len() < count {
            self.blocks.resize(count, Block::default());
        }
        let argon2 = Argon2::new(algorithm, version, params);
        let blocks = self.blocks.get_mut(..count)?;
        let output = Output::init_with(expected.len(), |out| {
            argon2
                .hash_password_into_with_memory(password, salt, out, &mut *blocks)
                .map_err(|_| argon2::password_hash::Error::Crypto)
        })
        .ok()?;
        // `Output`'s equality is constant-time.
        Some(output == expected)
    }
}

#[cfg(test)]
mod tests {
    use super::super::passwd::{hash_password, verify_password};
    use super::*;

    #[test]
    fn the_reused_buffer_agrees_with_argon2s_own_verification() {
        let hash = hash_password("wonderland").expect("hash");
        let mut memory = Memory::default();
        assert!(memory.verify(&hash, "wonderland"));
        assert!(!memory.verify(&hash, "wonderlanD"));
        assert!(verify_password(&hash, "wonderland"));
        // A hash of other parameters (argon2i, 8 MiB, 2 passes) written elsewhere still works.
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::generate(&mut password_hash::rand_core::OsRng);
        let params = Params::new(8192, 2, 1, None).expect("params");
        let other = Argon2::new(Algorithm::Argon2i, Version::V0x13, params)
            .hash_password(b"password", &salt)
            .expect("hash")
            .to_string();
        assert!(memory.verify(&other, "password"));
        assert!(!memory.verify(&other, "passwort"));
        assert_eq!(
            memory.blocks.len(),
            KEEP_BLOCKS,
            "shrunk back after a larger hash"
        );
        assert!(!memory.verify("not a hash", "x"));
    }

    #[tokio::test]
    async fn verifications_run_on_the_verifier_thread() {
        let hash = hash_password("pw").expect("hash");
        let verifier = Verifier::start().expect("thread");
        let name = verifier
            .run(|_| std::thread::current().name() == Some("tern-passwd"))
            .await;
        assert!(name);
        assert!(verifier.run(move |memory| memory.verify(&hash, "pw")).await);
    }
}
