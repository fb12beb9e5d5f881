//! Appends buffers and instructions to one template.

use crate::ids::BufferId;
use crate::program::{BufferDecl, Elem, Instr, Role};

#[derive(Debug, Default)]
pub struct Builder {
    pub buffers: Vec<BufferDecl>,
    pub instrs: Vec<Instr>,
}

impl Builder {
    /// Declares a buffer (no instruction).
    pub fn declare(&mut self, name: String, elem: Elem, shape: Vec<u64>, role: Role) -> BufferId {
        self.buffers.push(BufferDecl {
            name,
            elem,
            shape,
            role,
            partial: false,
        });
        BufferId(self.buffers.len() as u32 - 1)
    }

    /// Marks a buffer as holding a tensor-parallel partial sum.
    pub fn mark_partial(&mut self, b: BufferId) {
        if let Some(d) = self.buffers.get_mut(b.index()) {
            d.partial = true;
        }
    }

    /// Declares and allocates a buffer.
    pub fn alloc(&mut self, name: String, elem: Elem, shape: Vec<u64>, role: Role) -> BufferId {
        let b = self.declare(name, elem, shape, role);
        self.instrs.push(Instr::Alloc { buf: b });
        b
    }

    /// Allocates a new buffer shaped like `like`.
    pub fn alloc_like(&mut self, like: BufferId, name: String, role: Role) -> BufferId {
        let (elem, shape) = self
            .buffers
            .get(like.index())
            .map(|d| (d.elem, d.shape.clone()))
            .unwrap_or((Elem::F32, vec![]));
        self.alloc(name, elem, shape, role)
    }

    pub fn free(&mut self, b: BufferId) {
        self.instrs.push(Instr::Free { buf: b });
    }

    pub fn push(&mut self, i: Instr) {
        self.instrs.push(i);
    }

    pub fn shape(&self, b: BufferId) -> &[u64] {
        self.buffers.get(b.index()).map_or(&[], |d| &d.shape)
    }
}
