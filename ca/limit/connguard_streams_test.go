package limit

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// streamArena is a guard whose connections from each address are
// served, so that streams can be admitted on them as grpc-go's tap
// would.
type streamArena struct {
	g    *ConnGuard
	reg  *prometheus.Registry
	s    *guarded
	ctxs map[string]context.Context // a served connection of each address
}

func newStreamArena(t *testing.T, lim ConnLimits) *streamArena {
	reg := prometheus.NewRegistry()
	g := NewConnGuard(ConnGuardConfig{Limits: lim, Registerer: reg})
	return &streamArena{g: g, reg: reg, s: serveGuard(t, g, reg), ctxs: map[string]context.Context{}}
}

// conn returns the context of a served connection from the address from.
func (a *streamArena) conn(t *testing.T, from string) context.Context {
	if ctx, ok := a.ctxs[from]; ok {
		return ctx
	}
	c, ok := a.s.dialFrom(t, from)
	if !ok {
		t.Fatalf("a connection from %s was refused", from)
	}
	ctx := served(a.g, c)
	a.ctxs[from] = ctx
	return ctx
}

// admit admits a stream from the address from with a header list of
// headerBytes; its context, or the refusal.
func (a *streamArena) admit(t *testing.T, from string, headerBytes int) (context.Context, error) {
	t.Helper()
	return a.g.AdmitStream(a.conn(t, from), headerBytes)
}

func (a *streamArena) mustAdmit(t *testing.T, from string, headerBytes int) context.Context {
	t.Helper()
	ctx, err := a.admit(t, from, headerBytes)
	if err != nil {
		t.Fatalf("a stream from %s (%d header bytes): %v", from, headerBytes, err)
	}
	return ctx
}

// refusedWith checks that err is the refusal reason with a message
// containing msg.
func refusedWith(t *testing.T, err error, reason, msg string) {
	t.Helper()
	var ee *ExhaustedError
	if !errors.As(err, &ee) || ee.Reason != reason || !strings.Contains(ee.Msg, msg) || ee.RetryAfter <= 0 {
		t.Fatalf("refusal %v, want %s with a retry hint and %q", err, reason, msg)
	}
}

func ended(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	default:
		return nil
	}
}

// TestUnauthenticatedStreamCaps: the streams of one address not yet
// authenticated are capped, across its connections, a stream counting
// once more for each 4 KiB of its headers and of its message; one that
// authenticates or ends gives its place back; another address has its
// own.
func TestUnauthenticatedStreamCaps(t *testing.T) {
	a := newStreamArena(t, ConnLimits{MaxUnauthenticatedStreamsPerPeer: 4, MaxUnauthenticatedStreams: NoLimit, RequestMessageTimeout: NoLimit})
	first := a.mustAdmit(t, "127.0.0.1", 100)
	a.mustAdmit(t, "127.0.0.1", StreamHeaderUnit) // counts twice
	third := a.mustAdmit(t, "127.0.0.1", 0)
	// At its cap a newer stream of the address takes the place of its
	// oldest: a neighbour's requests that never authenticate cannot keep
	// out one that would.
	newest := a.mustAdmit(t, "127.0.0.1", 0)
	if err := ended(first); !errors.Is(err, ErrStreamEvicted) {
		t.Fatalf("the address's oldest stream at its cap: %v, want %v", err, ErrStreamEvicted)
	}
	wantSample(t, a.reg, "meshca_streams_refused_total", map[string]string{"reason": "evicted"}, 1)
	// A stream heavier than the cap on its own is refused.
	_, err := a.admit(t, "127.0.0.1", 4*StreamHeaderUnit)
	refusedWith(t, err, ReasonUnauthStreamsPerPeer, "this address already has 4 requests in progress that have not authenticated, the most it may, retry in 250ms")
	a.mustAdmit(t, "127.0.0.2", 0)
	wantSample(t, a.reg, "meshca_streams_unauthenticated", nil, 4)
	wantSample(t, a.reg, "meshca_streams_refused_total", map[string]string{"reason": "per_peer"}, 1)
	// Authenticated: its place is free, and it is not cancelled.
	ConnAuthenticated(newest)
	fourth := a.mustAdmit(t, "127.0.0.1", 0)
	if err := ended(newest); err != nil {
		t.Fatalf("an authenticated stream ended: %v", err)
	}
	// A message of 4 KiB takes the address past its cap: cancelled.
	a.g.HandleRPC(fourth, &stats.InPayload{Length: StreamHeaderUnit})
	if err := ended(fourth); !errors.Is(err, ErrStreamOverCap) {
		t.Fatalf("a stream whose message takes its address past the cap: %v, want %v", err, ErrStreamOverCap)
	}
	// A message under 4 KiB counts nothing more.
	a.g.HandleRPC(third, &stats.InPayload{Length: StreamHeaderUnit - 1})
	if err := ended(third); err != nil {
		t.Fatalf("a stream with a small message ended: %v", err)
	}
	// Ended (its context cancelled by grpc-go): its place is free.
	thirdCtx, cancel := context.WithCancel(a.conn(t, "127.0.0.3"))
	ctx, err := a.g.AdmitStream(thirdCtx, 0)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-ctx.Done()
	// Left: 127.0.0.1's second and third, 127.0.0.2's.
	waitSample(t, a.reg, "meshca_streams_unauthenticated", nil, 3)
}

// TestUnauthenticatedStreamsTotal: at the total, a newcomer from an
// address holding less makes the address holding the most give up its
// oldest stream; from the address holding the most, or as much as any,
// it is refused.
func TestUnauthenticatedStreamsTotal(t *testing.T) {
	a := newStreamArena(t, ConnLimits{MaxUnauthenticatedStreams: 6, MaxUnauthenticatedStreamsPerPeer: NoLimit, RequestMessageTimeout: NoLimit})
	var heavy []context.Context
	for range 4 {
		heavy = append(heavy, a.mustAdmit(t, "127.0.0.1", 0))
	}
	a.mustAdmit(t, "127.0.0.2", 0)
	a.mustAdmit(t, "127.0.0.2", 0)
	// Full: 127.0.0.2 (2) makes 127.0.0.1 (4) give up its oldest.
	a.mustAdmit(t, "127.0.0.2", 0)
	if err := ended(heavy[0]); !errors.Is(err, ErrStreamEvicted) {
		t.Fatalf("the heaviest address's oldest stream: %v, want %v", err, ErrStreamEvicted)
	}
	if err := ended(heavy[1]); err != nil {
		t.Fatalf("its second stream: %v", err)
	}
	// 3 each: a tie, refused.
	_, err := a.admit(t, "127.0.0.1", 0)
	refusedWith(t, err, ReasonUnauthStreams, "the CA holds 6 requests that have not authenticated, the most it may, this address as many as any")
	// One stream worth three (8 KiB of headers) from a fresh address
	// takes three from the heaviest.
	a.mustAdmit(t, "127.0.0.3", 2*StreamHeaderUnit)
	wantSample(t, a.reg, "meshca_streams_refused_total", map[string]string{"reason": "evicted"}, 4)
	wantSample(t, a.reg, "meshca_streams_refused_total", map[string]string{"reason": "total"}, 1)
	wantSample(t, a.reg, "meshca_streams_unauthenticated", nil, 4)
}

// TestRequestMessageDeadline: a stream is cancelled when its message has
// not come within RequestMessageTimeout, not once it has.
func TestRequestMessageDeadline(t *testing.T) {
	a := newStreamArena(t, ConnLimits{RequestMessageTimeout: 100 * time.Millisecond})
	late := a.mustAdmit(t, "127.0.0.1", 0)
	onTime := a.mustAdmit(t, "127.0.0.1", 0)
	a.g.HandleRPC(onTime, &stats.InPayload{Length: 10})
	select {
	case <-late.Done():
	case <-time.After(5 * time.Second):
	}
	if err := context.Cause(late); !errors.Is(err, ErrRequestMessageTimeout) {
		t.Fatalf("a stream without its message: %v, want %v", err, ErrRequestMessageTimeout)
	}
	time.Sleep(200 * time.Millisecond)
	if err := ended(onTime); err != nil {
		t.Fatalf("a stream whose message came: %v", err)
	}
	wantSample(t, a.reg, "meshca_streams_refused_total", map[string]string{"reason": "message_timeout"}, 1)
}

// TestStreamRefusalsCloseTheConnection: a connection whose streams keep
// being refused is closed at the 32nd.
func TestStreamRefusalsCloseTheConnection(t *testing.T) {
	a := newStreamArena(t, ConnLimits{MaxUnauthenticatedStreamsPerPeer: 1, RequestMessageTimeout: NoLimit})
	a.mustAdmit(t, "127.0.0.1", 0)
	c := a.conn(t, "127.0.0.1").Value(connKey{}).(*guardedConn)
	for i := range maxRefusedStreamsPerConn {
		// Heavier than the address's cap on its own: refused, not let
		// in in the place of the address's oldest.
		if _, err := a.admit(t, "127.0.0.1", StreamHeaderUnit); err == nil {
			t.Fatalf("stream %d past the cap admitted", i)
		}
		if i < maxRefusedStreamsPerConn-1 && closed(c) {
			t.Fatalf("the connection closed after %d refusals", i+1)
		}
	}
	waitFor(t, func() bool { return closed(c) }, "the connection to close")
	wantSample(t, a.reg, "meshca_connections_refused_total", map[string]string{"reason": "streams_refused"}, 1)
}

// TestEvictionsSpareAnAuthenticatedConnection: streams pushed out by
// other connections' newer ones count against a connection not yet
// authenticated, which is closed at the 32nd, but not against an
// authenticated one: a neighbour opening streams that never
// authenticate (the same address, or, at the total, any lighter one)
// must not get a client's authenticated connection, and the requests
// it has in progress, cut. An evicted stream leaves nothing behind.
func TestEvictionsSpareAnAuthenticatedConnection(t *testing.T) {
	a := newStreamArena(t, ConnLimits{MaxUnauthenticatedStreamsPerPeer: 1, RequestMessageTimeout: NoLimit})
	conn := func() (context.Context, *guardedConn) {
		c, ok := a.s.dialFrom(t, "127.0.0.1")
		if !ok {
			t.Fatal("a connection was refused")
		}
		return served(a.g, c), c.(*guardedConn)
	}
	clientCtx, client := conn()
	ConnAuthenticated(clientCtx)
	neighbourCtx, neighbour := conn()
	for i := range 2 * maxRefusedStreamsPerConn {
		// Each takes the place of the other's stream, the address's
		// oldest, in turn.
		if _, err := a.g.AdmitStream(clientCtx, 0); err != nil {
			t.Fatalf("round %d: the client's stream: %v", i, err)
		}
		if _, err := a.g.AdmitStream(neighbourCtx, 0); err != nil {
			t.Fatalf("round %d: the neighbour's stream: %v", i, err)
		}
		if closed(neighbour) {
			break
		}
	}
	if closed(client) {
		t.Fatal("the authenticated connection was closed for streams its neighbour pushed out")
	}
	waitFor(t, func() bool { return closed(neighbour) }, "the unauthenticated neighbour's connection to close")
	wantSample(t, a.reg, "meshca_connections_refused_total", map[string]string{"reason": "streams_refused"}, 1)
}

// TestHealthWatchCaps: watches are capped per address and in all; one
// that ends gives its place back.
func TestHealthWatchCaps(t *testing.T) {
	a := newStreamArena(t, ConnLimits{MaxHealthWatchesPerPeer: 2, MaxHealthWatches: 3, RequestMessageTimeout: NoLimit})
	w1 := a.mustAdmit(t, "127.0.0.1", 0)
	for _, ctx := range []context.Context{w1, a.mustAdmit(t, "127.0.0.1", 0), a.mustAdmit(t, "127.0.0.2", 0)} {
		if err := AdmitWatch(ctx); err != nil {
			t.Fatal(err)
		}
	}
	refusedWith(t, AdmitWatch(a.mustAdmit(t, "127.0.0.1", 0)), ReasonWatchesPerPeer, "this address already watches the health service 2 times")
	refusedWith(t, AdmitWatch(a.mustAdmit(t, "127.0.0.3", 0)), ReasonWatches, "the health service has 3 watchers")
	w1.Value(streamKey{}).(*guardedStream).cancel(nil)
	waitFor(t, func() bool { return AdmitWatch(a.mustAdmit(t, "127.0.0.3", 0)) == nil }, "a watch to end")
	if err := AdmitWatch(context.Background()); err != nil {
		t.Fatalf("a watch outside a guarded stream: %v", err)
	}
}

// waitFor polls ok for up to 5s.
func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
	}
}

func waitSample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64) {
	t.Helper()
	waitFor(t, func() bool { v, _ := sample(t, reg, name, labels); return v == want }, name)
	wantSample(t, reg, name, labels, want)
}

// TestHeaviest: the heaviest key is found as weights move.
func TestHeaviest(t *testing.T) {
	h := newHeaviest[string]()
	if _, _, ok := h.top(); ok {
		t.Fatal("an empty set has a top")
	}
	steps := []struct {
		key    string
		weight int
		top    []string // any of these
		w      int
	}{
		{"a", 1, []string{"a"}, 1},
		{"b", 3, []string{"b"}, 3},
		{"a", 3, []string{"a", "b"}, 3},
		{"b", 0, []string{"a"}, 3},
		{"a", 2, []string{"a"}, 2},
		{"c", 9, []string{"c"}, 9},
		{"c", 0, []string{"a"}, 2},
		{"a", -1, nil, 0},
	}
	for i, s := range steps {
		h.set(s.key, s.weight)
		k, w, ok := h.top()
		if ok != (s.top != nil) || w != s.w || ok && !strings.Contains(strings.Join(s.top, ","), k) {
			t.Fatalf("step %d: top %q %d %v, want one of %v at %d", i, k, w, ok, s.top, s.w)
		}
	}
}

var _ net.Conn = (*guardedConn)(nil)
