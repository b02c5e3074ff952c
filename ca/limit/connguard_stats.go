package limit

import (
	"context"
	"time"

	"google.golang.org/grpc/stats"
)

// connKey is the context key of an RPC's *guardedConn, streamKey of its
// *guardedStream.
type (
	connKey   struct{}
	streamKey struct{}
)

// ConnAuthenticated records that the request on ctx authenticated: its
// stream no longer counts as unauthenticated, and its connection is no
// longer closed for being idle or old unauthenticated. Without a guarded
// connection it does nothing.
func ConnAuthenticated(ctx context.Context) {
	if s, ok := ctx.Value(streamKey{}).(*guardedStream); ok {
		s.authenticated()
	}
	if c, ok := ctx.Value(connKey{}).(*guardedConn); ok {
		c.authenticated()
	}
}

// TagConn finds the guarded connection grpc-go now serves and puts it in
// the connection's context, which every stream's context derives from.
// That context ends with the connection (HandleConn): grpc-go does not
// cancel the context of a stream its tap refuses, nor stop the timer of
// that stream's grpc-timeout, so without a parent that ends they would
// stay in memory until that timeout, however far.
func (g *ConnGuard) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	g.mu.Lock()
	c := g.byAddr[connAddrs{local: addrPort(info.LocalAddr), remote: addrPort(info.RemoteAddr)}]
	g.mu.Unlock()
	if c == nil {
		return ctx
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.serving()
	return context.WithValue(ctx, connKey{}, c)
}

// HandleConn ends the context of a connection grpc-go stopped serving.
func (g *ConnGuard) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); !ok {
		return
	}
	if c, ok := ctx.Value(connKey{}).(*guardedConn); ok && c.cancel != nil {
		c.cancel()
	}
}

// TagRPC implements stats.Handler.
func (g *ConnGuard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC counts the RPCs in progress on a connection, so that one
// waiting for an answer is not idle, and stops the request message
// deadline of a stream once its message is in.
func (g *ConnGuard) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s := s.(type) {
	case *stats.InPayload:
		if st, ok := ctx.Value(streamKey{}).(*guardedStream); ok {
			st.received(s.Length)
		}
	case *stats.Begin:
		if c, ok := ctx.Value(connKey{}).(*guardedConn); ok {
			c.active.Add(1)
		}
	case *stats.End:
		if c, ok := ctx.Value(connKey{}).(*guardedConn); ok {
			c.lastActive.Store(time.Now().UnixNano())
			c.active.Add(-1)
		}
		if st, ok := ctx.Value(streamKey{}).(*guardedStream); ok {
			st.end()
		}
	}
}
