// Package etcdwatchtest helps test code that watches etcd: it runs real
// etcd members inside the test process, and puts a fault proxy between a
// client and a member, so that a test can cut, refuse, delay or blackhole
// the client's connections and check what its watches do. etcdwatch's own
// end-to-end tests and benchmarks use it.
//
// It is one package with two halves, because a test of watch code under
// faults nearly always needs both, and neither needs more than a few names:
//
//   - [Server]: an etcd member embedded in the process, from [StartEtcd]
//     (one member) or [StartCluster] (n members), which can be stopped and
//     restarted on the same data and ports, cut off from its peers while
//     clients still reach it ([Server.Isolate]), and asked whether it
//     leads.
//   - [Proxy]: a TCP proxy from a loopback port to a target, from
//     [NewProxy].
//
// The constructors that take a [testing.TB] are for tests: they keep data
// in t.TempDir(), fail the test if they cannot start, and stop what they
// started when the test ends. [StartEtcdIn], [StartClusterIn] and
// [ListenProxy] return an error instead and leave stopping to the caller
// ([Server.Stop], [StopAll], [Proxy.Close]), for TestMain, benchmarks and
// programs.
//
// Everything listens on 127.0.0.1 only, on ports the kernel picks. A member
// needs its ports before it starts (its peers are told them), so they are
// taken from the kernel and released just before etcd binds them; another
// process can take one in between, and a start that fails is therefore
// tried again on fresh ports. A restarted member binds its old ports again,
// which another process may have taken meanwhile.
//
// This module depends on go.etcd.io/etcd/server/v3; etcdwatch itself does
// not. A stopped member leaves idle HTTP connections of its peers behind
// for a moment; [LeakOptions] tells go.uber.org/goleak to ignore them.
package etcdwatchtest
