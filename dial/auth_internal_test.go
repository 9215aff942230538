package dial

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// TestUnauthenticatedTimeoutIsUnavailable: an Authenticate that ran out of
// authTimeout, the RPC's own context not ended, fails that RPC as
// Unavailable (it exceeded no deadline of its own), and says so; any other
// failure keeps its code and text. Catches DeadlineExceeded passed on, which
// a caller takes for its own deadline.
func TestUnauthenticatedTimeoutIsUnavailable(t *testing.T) {
	timedOut := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	err := unauthenticated("alice", timedOut)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, "etcdwatch: cannot authenticate as user alice: no answer within 5s", status.Convert(err).Message())
	require.ErrorIs(t, err, timedOut)

	noLeader := status.Error(codes.Unavailable, "etcdserver: no leader")
	err = unauthenticated("alice", noLeader)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, "etcdwatch: cannot authenticate as user alice: etcdserver: no leader", status.Convert(err).Message())
	learner := status.Error(codes.FailedPrecondition, "etcdserver: rpc not supported for learner")
	require.Equal(t, codes.FailedPrecondition, status.Code(unauthenticated("alice", learner)))
}
