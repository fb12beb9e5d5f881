//! A rank's parameter state as pieces of global tensors, and their assembly: what the
//! equivalence tests compare and what checkpoints store.

use kernels::Tensor32;
use program::ParamId;
use program::{ParamInfo, Role, Slice};

use super::{Executor, layout};
use crate::{Backend, Communicator, RuntimeError};

/// A flat range `[owned.0, owned.1)` of a local shard and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub owned: (usize, usize),
    pub data: Vec<f32>,
}

/// What one rank holds of one parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardState {
    pub param: ParamId,
    pub slice: Slice,
    /// The tensor-parallel split axis (0 when replicated).
    pub axis: usize,
    pub weight: Piece,
    pub m: Piece,
    pub v: Piece,
}

/// Which part of the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Weight,
    M,
    V,
}

fn piece(local_len: usize, owned: (u64, u64), t: Tensor32) -> Piece {
    if t.data.len() == local_len {
        Piece {
            owned: (0, local_len),
            data: t.data,
        }
    } else {
        let (s, e) = (owned.0 as usize, owned.1 as usize);
        let mut data = t.data;
        data.truncate(e - s);
        Piece {
            owned: (s, e),
            data,
        }
    }
}

impl<B: Backend, C: Communicator> Executor<'_, B, C> {
    fn role_buffer(&self, role: Role) -> Option<program::BufferId> {
        let (_, tpl, _) = self.parts();
        tpl.buffers
            .iter()
            .position(|d| d.role == role)
            .map(|i| program::BufferId(i as u32))
    }

    /// Every parameter shard this rank holds, with its optimizer state.
    pub fn shard_states(&self) -> Result<Vec<ShardState>, RuntimeError> {
        let (set, tpl, rank) = self.parts();
        let info = set.rank(rank).ok_or_else(|| RuntimeError::Program {
            rank,
            what: "no rank info".into(),
        })?;
        let mesh = &set.mesh;
        let mut out = Vec::new();
        for sh in &tpl.shards {
            let Some(p) = set.params.get(sh.param.index()) else {
                continue;
            };
            let slice = sh.slice_at(&p.shape, program::ShardAt::of(mesh, info.coords));
            let n = slice.len() as usize;
            let get = |role: Role| -> Result<Piece, RuntimeError> {
                let b = self
                    .role_buffer(role)
                    .ok_or_else(|| RuntimeError::Program {
                        rank,
                        what: format!("no {role:?} buffer"),
                    })?;
                Ok(piece(n, slice.owned, self.buffer(b)?))
            };
            out.push(ShardState {
                param: sh.param,
                axis: sh.tp.map_or(0, |t| usize::from(t.axis)),
                weight: piece(n, slice.owned, self.buffer(sh.init)?),
                m: get(Role::OptM(sh.param))?,
                v: get(Role::OptV(sh.param))?,
                slice,
            });
        }
        Ok(out)
    }

    /// Overwrites the optimizer moments from global tensors (resuming).
    pub fn load_moments(&mut self, m: &[Tensor32], v: &[Tensor32]) -> Result<(), RuntimeError> {
        for st in self.shard_states()? {
            for (role, global, mine) in [
                (Role::OptM(st.param), m, &st.m),
                (Role::OptV(st.param), v, &st.v),
            ] {
                let Some(g) = global.get(st.param.index()) else {
                    continue;
                };
                let local = layout::extract(&g.data, &g.shape, &st.slice, st.axis);
                let Some(b) = self.role_buffer(role) else {
                    continue;
                };
                let len = self.buffer(b)?.data.len();
                let mut data = local
                    .get(mine.owned.0..mine.owned.1)
                    .unwrap_or_default()
                    .to_vec();
                data.resize(len, 0.0);
                self.store(b, data)?;
            }
        }
        Ok(())
    }
}

/// Full tensors of `field` from every rank's shard states (any rank order).
pub fn assemble(params: &[ParamInfo], states: &[ShardState], field: Field) -> Vec<Tensor32> {
    let mut full: Vec<Tensor32> = params
        .iter()
        .map(|p| {
            let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
            let n = shape.iter().product();
            Tensor32 {
                shape,
                data: vec![0.0; n],
            }
        })
        .collect();
    for st in states {
        let Some(t) = full.get_mut(st.param.index()) else {
            continue;
        };
        let pc = match field {
            Field::Weight => &st.weight,
            Field::M => &st.m,
            Field::V => &st.v,
        };
        let shape = t.shape.clone();
        layout::insert(&mut t.data, &shape, &st.slice, st.axis, &pc.data, pc.owned);
    }
    full
}
