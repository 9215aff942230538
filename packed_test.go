package etcdwatch

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPackedKeepsTheRequest: a packed Request gives back exactly the
// Request it was made from, End's nil-ness included, in buffers of its
// own. Catches: an option bit lost or swapped, Key and End split at the
// wrong place, a nil End made empty, buffers shared with the caller's.
func TestPackedKeepsTheRequest(t *testing.T) {
	every := Range("a", "b").WithPrevKV().WithoutDeletes().WithProgressNotify().WithFragment().FromRevision(1 << 40)
	every.Isolated = true
	for _, r := range []Request{
		Key("k"), Prefix("p/"), FromKey(""), Range("a", "b").WithoutPuts(), every,
		{Key: []byte{}, End: []byte{0}}, {Key: []byte("\x00\xff"), End: []byte("\x01")},
	} {
		p := pack(r)
		got := p.request()
		require.Equal(t, r, got)
		require.Equal(t, r.End == nil, got.End == nil, "End's nil-ness of %v", r)
		if len(r.Key) > 0 {
			r.Key[0] ^= 0xff // the caller reuses its buffer
			require.NotEqual(t, r.Key, p.request().Key, "the Watch's copy changed with the caller's")
		}
	}
}
