//! Typed `u32` ids (cranelift-style): an index of one kind can never be used as another.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$m:meta])* $name:ident, $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);

        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id!(
    /// A local buffer of one program template.
    BufferId,
    "b"
);
id!(
    /// A parameter of the model (index into the program set's parameter table).
    ParamId,
    "p"
);
id!(
    /// A program template (ranks with the same pipeline stage share one).
    TemplateId,
    "t"
);
id!(
    /// A communicator group of the whole mesh.
    GroupId,
    "g"
);
id!(
    /// A gradient bucket: the parameters whose gradients one collective reduces together.
    BucketId,
    "bucket"
);
