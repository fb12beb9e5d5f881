//! Collectives and their `shard` dialect ops.

use super::*;

impl Emitter<'_> {
    pub(super) fn collective(
        &mut self,
        op: CollectiveOp,
        slot: Slot,
        axis: Option<u8>,
        x: &Val,
        out: &Ty,
        attrs: &str,
    ) -> Res<Val> {
        let (grid, gaxis, size) = self.grid(slot);
        let on = format!("on @{grid} grid_axes = [{gaxis}]");
        match op {
            CollectiveOp::AllReduce => {
                let x = self.reshape(x, &out.shape)?;
                Ok(self.define(
                    format!(
                        "shard.all_reduce {} {on} reduction = sum {attrs} : {} -> {}",
                        x.name,
                        x.ty.mlir(),
                        out.mlir()
                    ),
                    out.clone(),
                ))
            }
            CollectiveOp::AllGather => {
                let x = self.convert(x, out.elem)?;
                let (x, a) = match axis {
                    Some(a) if usize::from(a) < x.ty.shape.len() => (x, usize::from(a)),
                    Some(a) => return Err(format!("all-gather axis {a} of {}", x.ty.mlir())),
                    None => {
                        let n = x.ty.numel();
                        (self.reshape(&x, &[n])?, 0)
                    }
                };
                let mut shape = x.ty.shape.clone();
                shape[a] *= size;
                let ty = Ty::new(shape, out.elem);
                let mut y = self.define(
                    format!(
                        "shard.all_gather {} {on} gather_axis = {a} {attrs} : {} -> {}",
                        x.name,
                        x.ty.mlir(),
                        ty.mlir()
                    ),
                    ty,
                );
                if axis.is_none() && y.ty.numel() > out.numel() {
                    y = self.prefix(&y, out.numel());
                }
                self.reshape(&y, &out.shape)
            }
            CollectiveOp::ReduceScatter => {
                self.scatter_like("reduce_scatter", slot, axis, x, out, attrs)
            }
            CollectiveOp::AllToAll => {
                let x = self.convert(x, out.elem)?;
                let (x, a) = match axis {
                    Some(a) if usize::from(a) < x.ty.shape.len() => (x, usize::from(a)),
                    _ => {
                        let n = x.ty.numel();
                        (self.reshape(&x, &[n])?, 0)
                    }
                };
                if x.ty.shape[a] % size != 0 {
                    return Err(format!("all-to-all of {} over {size} ranks", x.ty.mlir()));
                }
                let y = self.define(format!(
                    "shard.all_to_all {} {on} split_axis = {a} concat_axis = {a} {attrs} : {} -> {}",
                    x.name,
                    x.ty.mlir(),
                    x.ty.mlir()
                ), x.ty);
                self.reshape(&y, &out.shape)
            }
            CollectiveOp::Reshard { from } => {
                let x = self.convert(x, out.elem)?;
                let (to, from) = (axis.map_or(usize::MAX, usize::from), usize::from(from));
                if to >= x.ty.shape.len() || from >= x.ty.shape.len() || x.ty.shape[to] % size != 0
                {
                    return Err(format!("reshard of {} over {size} ranks", x.ty.mlir()));
                }
                let mut shape = x.ty.shape.clone();
                shape[to] /= size;
                shape[from] *= size;
                let ty = Ty::new(shape, out.elem);
                let y = self.define(
                    format!(
                        "shard.all_to_all {} {on} split_axis = {to} concat_axis = {from} {attrs} : {} -> {}",
                        x.name,
                        x.ty.mlir(),
                        ty.mlir()
                    ),
                    ty,
                );
                self.reshape(&y, &out.shape)
            }
            CollectiveOp::Broadcast { root } => {
                let x = self.convert(x, out.elem)?;
                let x = self.reshape(&x, &out.shape)?;
                Ok(self.define(
                    format!(
                        "shard.broadcast {} {on} root = [{root}] {attrs} : ({}) -> {}",
                        x.name,
                        x.ty.mlir(),
                        out.mlir()
                    ),
                    out.clone(),
                ))
            }
        }
    }

    /// `reduce_scatter` or `all_slice`: this rank's piece along `axis`, or of the flattening
    /// (zero-padded to a multiple of the group size).
    pub(super) fn scatter_like(
        &mut self,
        op: &str,
        slot: Slot,
        axis: Option<u8>,
        x: &Val,
        out: &Ty,
        attrs: &str,
    ) -> Res<Val> {
        let (grid, gaxis, size) = self.grid(slot);
        // all_slice keeps the element type; reduce_scatter converts to the result's.
        let x = if op == "all_slice" {
            self.convert(x, out.elem)?
        } else {
            x.clone()
        };
        let (x, a) = match axis {
            Some(a) if usize::from(a) < x.ty.shape.len() => (x, usize::from(a)),
            Some(a) => return Err(format!("{op} axis {a} of {}", x.ty.mlir())),
            None => {
                let n = x.ty.numel();
                let piece = n.div_ceil(size.max(1));
                let flat = self.reshape(&x, &[n])?;
                (self.pad(&flat, piece * size), 0)
            }
        };
        if x.ty.shape[a] % size != 0 {
            return Err(format!(
                "{op} of {} along axis {a} over {size} ranks",
                x.ty.mlir()
            ));
        }
        let mut shape = x.ty.shape.clone();
        shape[a] /= size;
        let ty = Ty::new(shape, out.elem);
        let what = if op == "all_slice" {
            "slice_axis"
        } else {
            "scatter_axis"
        };
        let r = self.define(
            format!(
                "shard.{op} {} on @{grid} grid_axes = [{gaxis}] {what} = {a} {attrs} : {} -> {}",
                x.name,
                x.ty.mlir(),
                ty.mlir()
            ),
            ty,
        );
        self.reshape(&r, &out.shape)
    }
}
