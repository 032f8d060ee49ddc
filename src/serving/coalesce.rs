//! Identical requests in flight share one computation: the first (the leader)
//! runs it, the others attach and receive a clone of its result.

use crate::sync::Recover;
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;

use tokio::sync::watch;

pub struct Coalescer<K, V> {
    inflight: Mutex<HashMap<K, watch::Receiver<Option<V>>>>,
}

impl<K, V> Default for Coalescer<K, V> {
    fn default() -> Self {
        Self { inflight: Mutex::new(HashMap::new()) }
    }
}

enum Role<V> {
    Leader(watch::Sender<Option<V>>),
    Follower(watch::Receiver<Option<V>>),
}

/// Removes the leader's entry when its work ends or is dropped (client gone),
/// so that waiting followers retry instead of hanging.
struct LeaderEntry<'a, K: Hash + Eq, V> {
    map: &'a Mutex<HashMap<K, watch::Receiver<Option<V>>>>,
    key: &'a K,
    sender: &'a watch::Sender<Option<V>>,
}

impl<K: Hash + Eq, V> Drop for LeaderEntry<'_, K, V> {
    fn drop(&mut self) {
        let mut map = self.map.locked();
        if map.get(self.key).is_some_and(|rx| rx.same_channel(&self.sender.subscribe())) {
            map.remove(self.key);
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Coalescer<K, V> {
    /// Runs `work` unless an identical `key` is in flight, in which case it waits
    /// for that result. Returns the result and whether it was coalesced.
    pub async fn run<F, Fut>(&self, key: K, work: F) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        // Follow an identical request in flight; lead when there is none (or
        // its leader went away without a result).
        let tx = loop {
            let role = {
                let mut map = self.inflight.locked();
                match map.get(&key) {
                    Some(rx) => Role::Follower(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        map.insert(key.clone(), rx);
                        Role::Leader(tx)
                    }
                }
            };
            match role {
                Role::Follower(mut rx) => loop {
                    if let Some(value) = rx.borrow_and_update().clone() {
                        return (value, true);
                    }
                    if rx.changed().await.is_err() {
                        if let Some(value) = rx.borrow().clone() {
                            return (value, true);
                        }
                        break; // the leader went away without a result: try again
                    }
                },
                Role::Leader(tx) => break tx,
            }
        };
        let _entry = LeaderEntry { map: &self.inflight, key: &key, sender: &tx };
        let value = work().await;
        tx.send_replace(Some(value.clone()));
        (value, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn concurrent_identical_keys_run_once() {
        let coalescer = Arc::new(Coalescer::<u32, u32>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let (gate_tx, gate_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let (c, runs, mut gate) = (coalescer.clone(), runs.clone(), gate_rx.clone());
            tasks.push(tokio::spawn(async move {
                c.run(7, || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = gate.wait_for(|open| *open).await;
                    42
                })
                .await
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        gate_tx.send(true).unwrap();
        let results: Vec<(u32, bool)> = futures_results(tasks).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(results.iter().all(|(v, _)| *v == 42));
        assert_eq!(results.iter().filter(|(_, coalesced)| *coalesced).count(), 4);
        // Done: the next identical request runs again.
        assert_eq!(coalescer.run(7, || async { 43 }).await, (43, false));
    }

    #[tokio::test]
    async fn followers_retry_when_the_leader_is_dropped() {
        let coalescer = Arc::new(Coalescer::<u32, u32>::default());
        let c = coalescer.clone();
        let leader = tokio::spawn(async move { c.run(1, std::future::pending::<u32>).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let c = coalescer.clone();
        let follower = tokio::spawn(async move { c.run(1, || async { 5 }).await });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        leader.abort();
        assert_eq!(follower.await.unwrap(), (5, false));
    }

    async fn futures_results<T>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }
}
