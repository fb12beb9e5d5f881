//! Which groups a gradient is still a partial sum over: the tensor-parallel group (a
//! column-parallel product's input), the expert-parallel one (an expert layer's gathered
//! tokens: each rank's experts contribute their share), the context-parallel one (the
//! gathered keys and values of an attention: each rank's queries contribute theirs), or
//! several.

use crate::program::Slot;

/// A set of the groups a value's gradient must still be summed over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Partial {
    tp: bool,
    ep: bool,
    cp: bool,
}

impl Partial {
    pub const NONE: Partial = Partial {
        tp: false,
        ep: false,
        cp: false,
    };

    /// Partial over `group` alone (only `Tp`, `Ep` and `Cp` carry partial activation
    /// gradients).
    pub fn over(group: Slot) -> Partial {
        Partial {
            tp: group == Slot::Tp,
            ep: group == Slot::Ep,
            cp: group == Slot::Cp,
        }
    }

    /// Operand `k`'s set from a step's (operand, group) list.
    pub fn of_operand(list: &[(usize, Slot)], k: usize) -> Partial {
        list.iter()
            .filter(|(i, _)| *i == k)
            .fold(Partial::NONE, |p, &(_, g)| p.union(Partial::over(g)))
    }

    pub fn any(self) -> bool {
        self.tp || self.ep || self.cp
    }

    pub fn has(self, group: Slot) -> bool {
        match group {
            Slot::Tp => self.tp,
            Slot::Ep => self.ep,
            Slot::Cp => self.cp,
            _ => false,
        }
    }

    pub fn union(self, o: Partial) -> Partial {
        Partial {
            tp: self.tp || o.tp,
            ep: self.ep || o.ep,
            cp: self.cp || o.cp,
        }
    }

    pub fn intersection(self, o: Partial) -> Partial {
        Partial {
            tp: self.tp && o.tp,
            ep: self.ep && o.ep,
            cp: self.cp && o.cp,
        }
    }

    /// The groups of `self` not in `o`.
    pub fn minus(self, o: Partial) -> Partial {
        Partial {
            tp: self.tp && !o.tp,
            ep: self.ep && !o.ep,
            cp: self.cp && !o.cp,
        }
    }

    /// The groups, in a fixed order (tensor-parallel first).
    pub fn groups(self) -> impl Iterator<Item = Slot> {
        [
            (self.tp, Slot::Tp),
            (self.ep, Slot::Ep),
            (self.cp, Slot::Cp),
        ]
        .into_iter()
        .filter_map(|(on, g)| on.then_some(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_combine_by_group() {
        let both = Partial::over(Slot::Tp).union(Partial::over(Slot::Ep));
        assert_eq!(both.groups().collect::<Vec<_>>(), vec![Slot::Tp, Slot::Ep]);
        assert_eq!(both.minus(Partial::over(Slot::Ep)), Partial::over(Slot::Tp));
        assert_eq!(
            both.intersection(Partial::over(Slot::Ep)),
            Partial::over(Slot::Ep)
        );
        assert!(!Partial::NONE.any() && both.has(Slot::Ep) && !both.has(Slot::Dp));
        let list = [(0, Slot::Tp), (1, Slot::Tp), (0, Slot::Ep)];
        assert_eq!(Partial::of_operand(&list, 0), both);
        assert_eq!(Partial::of_operand(&list, 1), Partial::over(Slot::Tp));
        assert_eq!(Partial::of_operand(&list, 2), Partial::NONE);
    }
}
