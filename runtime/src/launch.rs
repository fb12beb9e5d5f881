//! Where this process stands among the ranks of a run, as its launcher tells it: torchrun
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), Open MPI's `mpirun`
//! (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`), MPICH/Hydra (`PMI_RANK`, `PMI_SIZE`,
//! `MPI_LOCALRANKID`) or Slurm's `srun` (`SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`,
//! `SLURM_LOCALID`: the step's task count, which only `srun` sets; `SLURM_NTASKS` is set in a
//! whole `sbatch` script or `salloc` shell, where one `plait run` is one process).
//! The local rank picks the GPU; the master address is where rank 0 serves the
//! [`crate::comm::rendezvous`] (NCCL's unique id), as torchrun's store does. Under MPI or
//! Slurm without `MASTER_ADDR` the id travels over MPI instead.

use crate::RuntimeError;

/// The launcher a process was started by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Mpich,
    Slurm,
}

impl Launcher {
    /// The variables naming (world rank, world size, local rank), in that order.
    fn vars(self) -> [&'static str; 3] {
        match self {
            Launcher::Torchrun => ["RANK", "WORLD_SIZE", "LOCAL_RANK"],
            Launcher::OpenMpi => [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ],
            Launcher::Mpich => ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"],
            Launcher::Slurm => ["SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI's mpirun",
            Launcher::Mpich => "MPICH's mpiexec",
            Launcher::Slurm => "Slurm's srun",
        }
    }
}

/// The master node's address and port, as the launcher set them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Master {
    pub addr: String,
    /// `MASTER_PORT`: torchrun's own store listens there.
    pub port: u16,
    /// `PLAIT_RENDEZVOUS_PORT`, where set.
    pub rendezvous: Option<u16>,
}

impl Master {
    /// The port rank 0 serves plait's rendezvous on: `PLAIT_RENDEZVOUS_PORT`, else the one
    /// after `MASTER_PORT` (torchrun's agent holds `MASTER_PORT` itself on the master node).
    pub fn rendezvous_port(&self) -> Option<u16> {
        self.rendezvous.or_else(|| self.port.checked_add(1))
    }

    /// The port rank 0 meets the other ranks on for `comm::TcpComm`: the one after the
    /// rendezvous port (a run may use both: NCCL's id, and the host communicator).
    pub fn mesh_port(&self) -> Option<u16> {
        self.rendezvous_port()?.checked_add(1)
    }
}

/// This process's place in a launched run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    /// Its index among the ranks of its node (which GPU it takes).
    pub local_rank: usize,
    /// `MASTER_ADDR` and `MASTER_PORT`, where set.
    pub master: Option<Master>,
}

impl Launch {
    /// Reads the process environment; `None` when no launcher started it.
    pub fn from_env() -> Result<Option<Launch>, RuntimeError> {
        Launch::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the launcher's variables through `var`. The first launcher whose world size is
    /// set wins: MPI's (an `mpirun` in a shell that exported `WORLD_SIZE` is still MPI), then
    /// torchrun's (its workers under `srun` also see the Slurm step's variables), then Slurm's.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>, RuntimeError> {
        let order = [
            Launcher::OpenMpi,
            Launcher::Mpich,
            Launcher::Torchrun,
            Launcher::Slurm,
        ];
        let Some(launcher) = order.into_iter().find(|l| var(l.vars()[1]).is_some()) else {
            return Ok(None);
        };
        let [rank_var, size_var, local_var] = launcher.vars();
        let world_size = number(&var, size_var)?.ok_or_else(|| unset(size_var))?;
        if world_size == 0 {
            return Err(bad(size_var, "0", "must be at least 1"));
        }
        let rank = number(&var, rank_var)?.ok_or_else(|| unset(rank_var))?;
        if rank >= world_size {
            return Err(bad(
                rank_var,
                &rank.to_string(),
                &format!("is not below {size_var}={world_size}"),
            ));
        }
        // Without a local rank every process is taken to be alone on its node.
        let local_rank = number(&var, local_var)?.unwrap_or(0);
        Ok(Some(Launch {
            launcher,
            rank,
            world_size,
            local_rank,
            master: master(&var)?,
        }))
    }
}

fn master(var: &impl Fn(&str) -> Option<String>) -> Result<Option<Master>, RuntimeError> {
    let (addr, port) = (var("MASTER_ADDR"), var("MASTER_PORT"));
    match (addr, port) {
        (None, None) => Ok(None),
        (Some(addr), Some(port)) => {
            let port = port
                .trim()
                .parse::<u16>()
                .map_err(|_| bad("MASTER_PORT", &port, "is not a port number (1-65535)"))?;
            if port == 0 {
                return Err(bad("MASTER_PORT", "0", "is not a port number (1-65535)"));
            }
            if addr.trim().is_empty() {
                return Err(bad("MASTER_ADDR", &addr, "is empty"));
            }
            let rendezvous = var("PLAIT_RENDEZVOUS_PORT")
                .map(|v| match v.trim().parse::<u16>() {
                    Ok(p) if p > 0 => Ok(p),
                    _ => Err(bad(
                        "PLAIT_RENDEZVOUS_PORT",
                        &v,
                        "is not a port number (1-65535)",
                    )),
                })
                .transpose()?;
            Ok(Some(Master {
                addr: addr.trim().to_string(),
                port,
                rendezvous,
            }))
        }
        (Some(_), None) => Err(unset_beside("MASTER_PORT", "MASTER_ADDR")),
        (None, Some(_)) => Err(unset_beside("MASTER_ADDR", "MASTER_PORT")),
    }
}

fn number(
    var: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Option<usize>, RuntimeError> {
    var(name)
        .map(|v| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| bad(name, &v, "is not a whole number"))
        })
        .transpose()
}

fn bad(var: &'static str, value: &str, reason: &str) -> RuntimeError {
    RuntimeError::Launch {
        var,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn unset(var: &'static str) -> RuntimeError {
    bad(var, "", "is not set, though the launcher's world size is")
}

fn unset_beside(var: &'static str, other: &'static str) -> RuntimeError {
    bad(
        var,
        "",
        &format!("is not set, though {other} is (set both, as torchrun does)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Result<Option<Launch>, RuntimeError> {
        Launch::from_vars(|k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn torchrun_sets_rank_world_local_rank_and_master() {
        let l = launch(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ])
        .expect("valid")
        .expect("launched");
        assert_eq!(
            (l.launcher, l.rank, l.world_size, l.local_rank),
            (Launcher::Torchrun, 5, 8, 1)
        );
        assert_eq!(
            l.master,
            Some(Master {
                addr: "node0".into(),
                port: 29500,
                rendezvous: None,
            })
        );
        assert_eq!(l.master.and_then(|m| m.rendezvous_port()), Some(29501));
    }

    #[test]
    fn mpi_and_slurm_are_read_and_no_launcher_is_none() {
        let ompi = launch(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("SLURM_STEP_NUM_TASKS", "4"),
            ("SLURM_PROCID", "0"),
            ("WORLD_SIZE", "16"),
        ])
        .expect("valid")
        .expect("launched");
        assert_eq!(
            (ompi.launcher, ompi.rank, ompi.local_rank),
            (Launcher::OpenMpi, 3, 3)
        );
        let slurm = launch(&[("SLURM_PROCID", "2"), ("SLURM_STEP_NUM_TASKS", "4")])
            .expect("valid")
            .expect("launched");
        assert_eq!(
            (slurm.launcher, slurm.rank, slurm.local_rank),
            (Launcher::Slurm, 2, 0)
        );
        // An sbatch script or salloc shell: the job's task count, no step: one process.
        let script = launch(&[("SLURM_NTASKS", "8"), ("SLURM_PROCID", "0")]).expect("valid");
        assert_eq!(script, None);
        // torchrun's workers inside an srun step are torchrun's ranks.
        let worker = launch(&[
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_PROCID", "1"),
            ("RANK", "9"),
            ("WORLD_SIZE", "16"),
        ])
        .expect("valid")
        .expect("launched");
        assert_eq!((worker.launcher, worker.rank), (Launcher::Torchrun, 9));
        assert_eq!(launch(&[("HOME", "/root")]).expect("valid"), None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let message = |vars: &[(&str, &str)]| match launch(vars) {
            Err(e) => e.to_string(),
            Ok(l) => panic!("accepted {l:?}"),
        };
        let m = message(&[("RANK", "8"), ("WORLD_SIZE", "8")]);
        assert!(
            m.contains("RANK=\"8\"") && m.contains("WORLD_SIZE=8"),
            "{m}"
        );
        let m = message(&[("WORLD_SIZE", "8")]);
        assert!(m.contains("RANK") && m.contains("not set"), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "two")]);
        assert!(m.contains("WORLD_SIZE=\"two\""), "{m}");
        let m = message(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "n0")]);
        assert!(m.contains("MASTER_PORT") && m.contains("not set"), "{m}");
        let m = message(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "n0"),
            ("MASTER_PORT", "70000"),
        ]);
        assert!(m.contains("MASTER_PORT=\"70000\""), "{m}");
    }
}
