package dial

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFreshTokenLagging: what a refusal of a token no RPC has been served
// with yet is taken for. Catches a dead token (its TTL passed before it
// was used, or it was revoked) kept for every stream a member refuses it
// on, which a Stream's backoff spreads over tens of seconds.
func TestFreshTokenLagging(t *testing.T) {
	issued := time.Unix(1000, 0)
	for _, c := range []struct {
		name    string
		f       freshToken
		member  uint64
		after   time.Duration
		lagging bool
	}{
		{"another member, at once", freshToken{issuer: 1, issuedAt: issued}, 2, 0, true},
		{"another member, within lagFor", freshToken{issuer: 1, issuedAt: issued}, 2, lagFor - time.Millisecond, true},
		{"another member, after lagFor", freshToken{issuer: 1, issuedAt: issued}, 2, lagFor, false},
		{"its issuer", freshToken{issuer: 1, issuedAt: issued}, 1, 0, false},
		{"a member not known", freshToken{issuer: 1, issuedAt: issued}, 0, 0, false},
		{"an issuer not known", freshToken{issuedAt: issued}, 2, 0, false},
		{"once served", freshToken{issuer: 1, issuedAt: issued, served: true}, 2, 0, false},
		{"the last refusal taken", freshToken{issuer: 1, issuedAt: issued, refusals: maxLagRefusals - 1}, 2, 0, true},
		{"refusals used up", freshToken{issuer: 1, issuedAt: issued, refusals: maxLagRefusals}, 2, 0, false},
		{"the zero value", freshToken{}, 2, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := c.f
			require.Equal(t, c.lagging, f.lagging(c.member, issued.Add(c.after)))
			if c.lagging {
				require.Equal(t, c.f.refusals+1, f.refusals, "counted")
			} else {
				require.Equal(t, c.f.refusals, f.refusals, "not counted")
			}
		})
	}
}
