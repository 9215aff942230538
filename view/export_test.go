package view

import (
	"bytes"
	"context"
	"encoding/binary"
)

// This file lets the black-box tests wait on a view without it asking the
// server anything, ask for progress on a view's watch alone, and make
// saved states of other versions.

// AwaitRevision waits until v has published a state at rev or later, or
// ctx ends. Unlike WaitForRevision it never asks the server.
func AwaitRevision[T any](ctx context.Context, v *View[T], rev int64) error {
	return v.core.await(ctx, atLeast[T](rev))
}

// RequestProgress asks for progress on v's watch alone.
func RequestProgress[T any](ctx context.Context, v *View[T]) (int64, error) {
	return v.core.progress(ctx)
}

// StateOfVersion returns a copy of the saved state b made as a writer of
// format version v would make it: the version set and the header's
// checksum made right (the entries are those of version 1).
func StateOfVersion(b []byte, v uint32) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(b[len(stateMagic):], v)
	return resum(b)
}

// ReadHeaderLength returns how many bytes of the saved state in b its
// header takes.
func ReadHeaderLength(b []byte) (int, error) {
	r := bytes.NewReader(b)
	sr, _, err := readHeader(r)
	if err != nil {
		return 0, err
	}
	return int(r.Size()) - r.Len() - (len(sr.buf) - sr.pos), nil
}

// CopyOf returns the View an ended copy (Share of an ended View) answers
// as, or nil for a View that is no copy.
func CopyOf[T any](v *View[T]) *View[T] { return v.of }

// SavedRevision returns the revision of the saved state in b.
func SavedRevision(b []byte) (int64, error) {
	_, h, err := readHeader(bytes.NewReader(b))
	return h.revision, err
}

// SavedCluster returns the ID of the cluster the saved state in b says it
// came from.
func SavedCluster(b []byte) (uint64, error) {
	_, h, err := readHeader(bytes.NewReader(b))
	return h.cluster, err
}

// SaveStateFileNow has v's WithStateFile save now, as a tick of its save
// loop does (WithStateFile(path, 0): the loop never ticks).
func SaveStateFileNow[T any](v *View[T]) { v.core.saveFile() }
