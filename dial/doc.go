// Package dial builds the gRPC connection a Stream needs to ride out the
// loss of an etcd member, without etcd's official client.
//
// New returns a plain *grpc.ClientConn over several members, for
// etcdwatch.Open or for anything else that speaks gRPC to etcd (a KV
// client, say). It uses grpc-go's own machinery:
//
//   - a fixed list of the members' addresses and the round_robin policy,
//     so each new Watch stream goes to a member that is up, and a Stream
//     whose member fails (or, with etcdwatch.WithRequireLeader, loses its
//     leader) resumes on another;
//   - gRPC keepalive, a ping after 10s without traffic and 5s for its
//     answer (etcd refuses pings more often than every 5s), which is what
//     replaces a TCP connection that silently stopped carrying packets;
//   - a connect backoff from 100ms up to 3s, so a member that comes back
//     is used again within seconds (gRPC's own waits from 1s up to 2
//     minutes).
//
// Transport security is always chosen explicitly: WithTLS or WithTLSFiles
// for TLS, each member's certificate verified against that member's own
// host, or WithInsecure for plain text. WithPassword authenticates with
// etcd's Auth RPC and keeps a valid token on every RPC. gRPC's own options
// go through WithGRPCOptions.
//
// The options here are of type Option, which gRPC does not accept: an
// option of this package handed to grpc.NewClient does not compile, rather
// than being silently ignored.
package dial
