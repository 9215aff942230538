package view

import (
	"bytes"
	"encoding/binary"
)

// StateOfVersion returns a copy of the saved state b made as a writer of
// format version v would make it: the version set and the header's
// checksum made right (the entries are those of version 1).
func StateOfVersion(b []byte, v uint32) []byte {
	b = append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(b[len(stateMagic):], v)
	return resum(b)
}

// SavedRevision returns the revision of the saved state in b.
func SavedRevision(b []byte) (int64, error) {
	_, h, err := readHeader(bytes.NewReader(b))
	return h.revision, err
}
