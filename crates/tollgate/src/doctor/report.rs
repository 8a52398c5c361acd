//! [`Repair`]: one repair over a corrupt item; [`DoctorReport`]: what a doctor run found
//! and did.

use serde::Serialize;

use super::CorruptItem;

/// One repair an administrative write or the doctor made over a corrupt item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repair {
    /// The corrupt item.
    #[serde(flatten)]
    pub corrupt: CorruptItem,
    /// What was done to it.
    pub action: String,
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.corrupt, self.action)
    }
}

impl Repair {
    /// Record and log a repair (a warning, target `tollgate::repair`).
    pub(crate) fn logged(corrupt: CorruptItem, action: impl Into<String>) -> Repair {
        let r = Repair {
            corrupt,
            action: action.into(),
        };
        tracing::warn!(
            target: "tollgate::repair",
            key = %r.corrupt.key,
            attribute = r.corrupt.attribute.as_deref().unwrap_or("-"),
            reason = %r.corrupt.reason,
            action = %r.action,
            "repaired a corrupt item"
        );
        r
    }
}

/// What [`crate::Admin::doctor`] found (and, with `repair`, did).
///
/// [`crate::Admin::doctor`]: crate::Admin::doctor
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DoctorReport {
    /// The namespace scanned.
    pub namespace: String,
    /// Items read (audit records not included).
    pub scanned: usize,
    /// Audit records read (checked as the others are).
    pub audit_records: usize,
    /// Items of a key layout tollgate does not know, not checked.
    pub unrecognised: usize,
    /// Every corrupt item, in scan order.
    pub corrupt: Vec<CorruptItem>,
    /// What `repair` deleted.
    pub repaired: Vec<Repair>,
}

impl DoctorReport {
    /// The corrupt items no repair of this run removed.
    pub fn remaining(&self) -> Vec<&CorruptItem> {
        self.corrupt
            .iter()
            .filter(|c| !self.repaired.iter().any(|r| r.corrupt.key == c.key))
            .collect()
    }
}
