package view

import (
	"encoding/json"
)

// Entry is one key of a view: its decoded value and the revisions of the
// KeyValue it was decoded from. Get and All give copies, but the Entry and
// Prev of a Change are shared by every subscriber, and a Value by the view,
// its snapshots and every copy: never modify a Change's Entry, nor what a
// Value points to.
type Entry[T any] struct {
	Key   string
	Value T // the zero T when Err is set
	// Err is the decode function's error for this value; the key is in the
	// view all the same, so that the view holds every key of its range.
	Err            error
	CreateRevision int64 // revision of the key's last creation
	ModRevision    int64 // revision of the key's last change
	Version        int64 // number of changes since creation
	Lease          int64 // lease ID, 0 when none
	size           int   // bytes of the key and of the value as stored
}

// Decoder turns a key's value into a view's T. It may keep value (the view
// gives each one a buffer of its own) and must not modify key; nor value,
// in a view that saves its state (WithSave), which keeps value to save it
// as the server sent it. It is called from the view's own goroutine, one
// value at a time, so it must not Close the last View of its state (see
// View.Close).
type Decoder[T any] func(key, value []byte) (T, error)

// DecodeBytes is the Decoder of a plain view: the value as it was stored.
func DecodeBytes(_, value []byte) ([]byte, error) { return value, nil }

// DecodeJSON is a Decoder of JSON values, with encoding/json.
func DecodeJSON[T any](_, value []byte) (T, error) {
	var v T
	err := json.Unmarshal(value, &v)
	return v, err
}
