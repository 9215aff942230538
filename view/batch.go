package view

import (
	"fmt"
)

// ChangeKind says what a Change did to its key.
type ChangeKind uint8

const (
	Created ChangeKind = iota + 1 // the key did not exist before
	Updated                       // the key existed and has a new value
	Deleted                       // the key no longer exists
)

// String returns "created", "updated" or "deleted".
func (k ChangeKind) String() string {
	switch k {
	case Created:
		return "created"
	case Updated:
		return "updated"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("ChangeKind(%d)", k)
}

// Change is one key's change in a Batch.
type Change[T any] struct {
	Kind ChangeKind
	Key  string
	// Revision is the revision of the change: for a key created or
	// updated, its ModRevision, in every kind of batch; for a delete in an
	// Events batch, the deletion's. For a delete in a Relisted batch it is
	// the batch's Revision: etcd keeps no record of when a deleted key
	// went, only that it went after From and by then.
	Revision int64
	Entry    *Entry[T] // the key after the change; nil when Deleted
	Prev     *Entry[T] // the key before it; nil when Created
}

// BatchKind says how a Batch came about.
type BatchKind uint8

const (
	// Events: the changes of whole revisions, as the watch reported them.
	Events BatchKind = iota + 1
	// Relisted: the view could not follow its watch (its history was
	// compacted, or a check found it wrong) and listed its range again at
	// Revision. Changes is exactly the difference between the state at From
	// and the state at Revision; unchanged keys are not in it. A key deleted
	// and created again in between comes as Deleted then Created. The batch
	// is the marker that the view is synced at Revision.
	Relisted
	// Resync: the whole state at Revision, every key as Created, given to a
	// subscriber instead of the changes it fell too far behind to be kept
	// for it, or first when it asked for no revision. Replace what you hold.
	Resync
)

// String returns "events", "relisted" or "resync".
func (k BatchKind) String() string {
	switch k {
	case Events:
		return "events"
	case Relisted:
		return "relisted"
	case Resync:
		return "resync"
	}
	return fmt.Sprintf("BatchKind(%d)", k)
}

// Batch is a step of a view from the state at revision From to the state at
// Revision: the changes of whole revisions, in order, never half of one
// (a Relisted batch's in key order: a listing cannot tell their order).
type Batch[T any] struct {
	Kind           BatchKind
	From, Revision int64
	Changes        []Change[T]

	// same, for a Relisted batch: the view's state at From was its state
	// up to this revision, at least From (it moved on without changes),
	// so a subscriber from a revision up to it may take the batch as a
	// step from there; beyond it, what changed since is not known: a
	// Resync.
	same int64
}
