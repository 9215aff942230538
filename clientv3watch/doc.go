// Package clientv3watch is a drop-in clientv3.Watcher that runs the watches
// of a go.etcd.io/etcd/client/v3 Client on etcdwatch. One line switches an
// existing program over:
//
//	cli.Watcher = clientv3watch.New(cli)
//
// after which every cli.Watch, cli.RequestProgress and cli.Close goes
// through etcdwatch, on cli's own connection, with its TLS and auth token.
//
// Set the client's keepalive. clientv3 dials without gRPC keepalive unless
// clientv3.Config sets DialKeepAliveTime, and a connection that silently
// stops carrying packets (a NAT or firewall forgetting the flow) then stays
// up for gRPC. The Stream's liveness probe (etcdwatch.WithLiveness, 30s
// idle and 10s timeout by default) notices the silence and replaces its
// Watch stream, but the new one opens on the same dead connection: the
// watches hear nothing more, as with clientv3's own Watcher, until gRPC
// keepalive closes the connection. Set DialKeepAliveTime and
// DialKeepAliveTimeout (10s and 5s, say: gRPC takes no less than 10s), or
// use NewFromConn with a connection from dial.New, which has keepalive on.
//
// Every watch option means what it means in clientv3 (WithPrefix,
// WithFromKey, WithRange, WithRev, WithPrevKV, WithFilterPut,
// WithFilterDelete, WithProgressNotify, WithFragment, WithCreatedNotify),
// and responses are filled as clientv3 fills them, so that Err,
// IsProgressNotify, IsCreate and IsModify answer alike: a compacted watch
// gets a response with CompactRevision and ErrCompacted, a refused one a
// canceled response whose Err says why, a watch whose stream ends for good
// (its connection closed, say) a canceled response whose Err is the gRPC
// error that ended it (codes.Canceled for a closed connection), and a
// watch under clientv3.WithRequireLeader ends with ErrNoLeader when its
// member loses its leader. Watches whose contexts carry different outgoing
// metadata go on different streams, as with clientv3.
//
// The client's receive limit (clientv3.Config.MaxCallRecvMsgSize) is a
// promise about memory, kept as clientv3 keeps it: a response above it, in
// a watch without WithFragment, ends the watches of its stream with a
// canceled response whose Err has gRPC's code ResourceExhausted, and none
// of its events. NewFromConn, which has no client, takes the limit as a
// Stream option, etcdwatch.WithCallOptions(grpc.MaxCallRecvMsgSize(n)).
//
// # Where it differs from clientv3, on purpose
//
//   - A watch's buffer is bounded (etcdwatch.WithBufferLimit,
//     WithBufferBytes) instead of growing without limit: a consumer that
//     stops reading holds up the stream for a moment, then its watch is
//     paused on the server and resumed from its next revision once it has
//     read half its backlog. Nothing is lost; events may arrive later;
//     but if the store is compacted past that revision meanwhile, the
//     watch ends with a compacted response, where clientv3 would still
//     hold the events (etcdwatch.WithBufferLimit(math.MaxInt) and
//     WithBufferBytes(math.MaxInt) in New's options buffer as clientv3
//     does, without bound). A paused watch gets no RequestProgress
//     notification.
//   - Responses for a consumer that is behind may be joined, up to 64
//     events, always whole revisions in order; clientv3 hands over one
//     response per server message.
//   - A final response waits for its reader as long as the watch's
//     context lives; clientv3 gives up on it after 250 ms and closes the
//     channel without it.
//   - RequestProgress is repeated until the server answers (etcd 3.4.31+,
//     3.5.13+ and 3.6+ ignore a request while a watch on the stream catches
//     up, and 3.4.25-3.4.30 and 3.5.8-3.5.12 can lose one; clientv3's is
//     then lost), and at most one is outstanding per stream.
//     On etcd 3.4.0-3.4.24 and 3.5.0-3.5.7, whose answers can run ahead
//     of events (etcd #15220, etcdwatch.ErrProgressUnsupported), it sends
//     nothing (the Stream logs a warning when it learns the release);
//     clientv3 sends it.
//   - A create refused by the server gets a final response with
//     CancelReason set (clientv3 sets an unexported error instead), and Err
//     returns the etcd error for it: errors.Is(err,
//     rpctypes.ErrPermissionDenied) holds, where clientv3 returns a plain
//     error with the gRPC status text.
//   - A watch that loses its leader under WithRequireLeader gets a final
//     response with CancelReason "etcdserver: no leader"; clientv3's has
//     none. Err is ErrNoLeader with both.
//   - A refusal ends only its own watch; clientv3 keeps the refusal as its
//     stream's error and may send it to other watches on that stream. So
//     does a create larger than the server or grpc.MaxCallSendMsgSize
//     accepts: gRPC ends the whole stream for it, with ResourceExhausted,
//     which clientv3 passes to every watch of the stream; here that watch
//     alone gets a final response whose Err says so, and the others resume
//     on a new stream.
//   - The created notification's header carries the revision only, the
//     store's when the server created the watch (as clientv3's, whatever
//     WithRev says); its cluster, member and term are zero, where clientv3
//     has the server's. Event and progress responses carry the server's
//     whole header.
//   - A watch has no goroutine of its own while it has nothing to deliver
//     (clientv3 keeps one for each watch): responses are turned into
//     clientv3's and handed over by a goroutine that runs only while the
//     watch has some waiting for its reader (an etcdwatch.Handler with
//     WithGoroutines(0)).
package clientv3watch
