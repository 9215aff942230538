package dial

import "testing"

// OnAwaitAuthTurn has f called whenever an RPC that needs a token starts
// to wait for its turn to authenticate, having noted the Authenticates
// made so far, until t ends. Not for parallel tests.
func OnAwaitAuthTurn(t testing.TB, f func()) {
	testHookAwaitTurn = f
	t.Cleanup(func() { testHookAwaitTurn = nil })
}
