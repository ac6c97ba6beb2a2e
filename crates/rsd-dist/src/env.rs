//! torchrun's rendezvous variables, read once into a [`Rendezvous`].
use crate::error::{DistError, Result};

/// Where and who this process is, as torchrun (or a SLURM script exporting the same variables)
/// describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// `MASTER_ADDR`: the host of rank 0's store.
    pub master_addr: String,
    /// `MASTER_PORT`: its TCP port.
    pub master_port: u16,
    /// `RANK`: this process's global rank.
    pub rank: usize,
    /// `WORLD_SIZE`: the number of processes.
    pub world_size: usize,
    /// `LOCAL_RANK`: this process's rank on its node (its GPU index).
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`: the number of processes on this node.
    pub local_world_size: usize,
    /// `Some(TORCHELASTIC_RESTART_COUNT)` when torchrun's agent hosts the store
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`): then every rank, rank 0 included, is a client.
    pub agent_store: Option<u32>,
}

const MASTER_ADDR: (&str, &str) = (
    "MASTER_ADDR",
    "the host name or IP address of rank 0 (e.g. 127.0.0.1 on one machine)",
);
const MASTER_PORT: (&str, &str) = (
    "MASTER_PORT",
    "a free TCP port on MASTER_ADDR, 1..=65535 (e.g. 29500)",
);
const RANK: (&str, &str) = ("RANK", "this process's global rank, 0..WORLD_SIZE-1");
const WORLD_SIZE: (&str, &str) = ("WORLD_SIZE", "the total number of processes, at least 1");
const LOCAL_RANK: (&str, &str) = (
    "LOCAL_RANK",
    "this process's rank on its node, 0..LOCAL_WORLD_SIZE-1",
);
const LOCAL_WORLD_SIZE: (&str, &str) = (
    "LOCAL_WORLD_SIZE",
    "the number of processes on this node, at least 1",
);

impl Rendezvous {
    /// Reads the variables from the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |(name, expected): (&'static str, &'static str)| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .ok_or(DistError::MissingEnv { name, expected })
        };
        let number = |var: (&'static str, &'static str)| -> Result<usize> {
            let value = get(var)?;
            value.parse().map_err(|_| DistError::InvalidEnv {
                name: var.0,
                value,
                expected: var.1.to_owned(),
            })
        };
        let master_addr = get(MASTER_ADDR)?;
        let port = get(MASTER_PORT)?;
        let master_port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(DistError::InvalidEnv {
                    name: MASTER_PORT.0,
                    value: port,
                    expected: MASTER_PORT.1.to_owned(),
                })
            }
        };
        let agent_store = match lookup("TORCHELASTIC_USE_AGENT_STORE").as_deref() {
            Some("True") => {
                let attempt = lookup("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
                Some(attempt.trim().parse().map_err(|_| DistError::InvalidEnv {
                    name: "TORCHELASTIC_RESTART_COUNT",
                    value: attempt,
                    expected: "a non-negative integer (torchrun sets it)".into(),
                })?)
            }
            _ => None,
        };
        let r = Rendezvous {
            master_addr,
            master_port,
            rank: number(RANK)?,
            world_size: number(WORLD_SIZE)?,
            local_rank: number(LOCAL_RANK)?,
            local_world_size: number(LOCAL_WORLD_SIZE)?,
            agent_store,
        };
        r.validate()?;
        Ok(r)
    }

    /// Checks that the numbers are consistent with each other (nothing here can check them
    /// against the other ranks; the rendezvous does).
    pub fn validate(&self) -> Result<()> {
        let invalid = |name: &'static str, value: usize, expected: String| DistError::InvalidEnv {
            name,
            value: value.to_string(),
            expected,
        };
        if self.world_size == 0 {
            return Err(invalid(WORLD_SIZE.0, 0, WORLD_SIZE.1.into()));
        }
        if self.rank >= self.world_size {
            return Err(invalid(
                RANK.0,
                self.rank,
                format!("a rank below WORLD_SIZE={}", self.world_size),
            ));
        }
        if self.local_world_size == 0 || self.local_world_size > self.world_size {
            return Err(invalid(
                LOCAL_WORLD_SIZE.0,
                self.local_world_size,
                format!("1..=WORLD_SIZE={}", self.world_size),
            ));
        }
        if self.local_rank >= self.local_world_size {
            return Err(invalid(
                LOCAL_RANK.0,
                self.local_rank,
                format!("a rank below LOCAL_WORLD_SIZE={}", self.local_world_size),
            ));
        }
        Ok(())
    }

    /// The variables of rank `rank` of `world_size` processes on this machine, talking to
    /// `127.0.0.1:port`: what a local launcher (or a test) exports for each child.
    pub fn local(port: u16, rank: usize, world_size: usize) -> Self {
        Rendezvous {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            agent_store: None,
        }
    }

    /// The variables as `(name, value)` pairs, for a launcher to set on a child process.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (MASTER_ADDR.0, self.master_addr.clone()),
            (MASTER_PORT.0, self.master_port.to_string()),
            (RANK.0, self.rank.to_string()),
            (WORLD_SIZE.0, self.world_size.to_string()),
            (LOCAL_RANK.0, self.local_rank.to_string()),
            (LOCAL_WORLD_SIZE.0, self.local_world_size.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const FULL: [(&str, &str); 6] = [
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
    ];

    #[test]
    fn reads_torchrun_variables() {
        let r = Rendezvous::from_lookup(lookup(&FULL)).unwrap();
        assert_eq!(r, Rendezvous::local(29500, 1, 2));
        let env: Vec<(&str, String)> = r.to_env();
        let again = Rendezvous::from_lookup(move |n| {
            env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone())
        })
        .unwrap();
        assert_eq!(again, r);
    }

    #[test]
    fn agent_store_is_recognised() {
        let mut vars = FULL.to_vec();
        vars.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        vars.push(("TORCHELASTIC_RESTART_COUNT", "3"));
        assert_eq!(
            Rendezvous::from_lookup(lookup(&vars)).unwrap().agent_store,
            Some(3)
        );
    }

    #[test]
    fn each_missing_variable_is_named_with_what_it_should_hold() {
        for (skip, (missing, _)) in FULL.iter().enumerate() {
            let vars: Vec<_> = FULL
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, v)| *v)
                .collect();
            let err = Rendezvous::from_lookup(lookup(&vars)).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, DistError::MissingEnv { name, .. } if name == *missing),
                "{text}"
            );
            assert!(
                text.contains(missing) && text.contains("expected"),
                "{text}"
            );
        }
    }

    #[test]
    fn bad_values_are_refused() {
        let cases = [
            ("MASTER_PORT", "70000"),
            ("MASTER_PORT", "0"),
            ("RANK", "x"),
            ("RANK", "2"),
            ("WORLD_SIZE", "0"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "3"),
        ];
        for (name, value) in cases {
            let vars: Vec<_> = FULL
                .iter()
                .map(|&(k, v)| if k == name { (k, value) } else { (k, v) })
                .collect();
            let err = Rendezvous::from_lookup(lookup(&vars)).unwrap_err();
            assert!(
                matches!(err, DistError::InvalidEnv { .. }),
                "{name}={value}: {err}"
            );
        }
    }
}
