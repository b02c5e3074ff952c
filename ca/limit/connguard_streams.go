package limit

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The reasons of the ResourceExhausted refusals of streams: an address
// or the server at its cap of streams not yet authenticated, or of
// health watches.
const (
	ReasonUnauthStreamsPerPeer = "unauthenticated_streams_per_peer"
	ReasonUnauthStreams        = "unauthenticated_streams"
	ReasonWatchesPerPeer       = "health_watches_per_peer"
	ReasonWatches              = "health_watches"
)

// The reason label values of meshca_streams_refused_total.
const (
	streamsPerPeer        = "per_peer"
	streamsTotal          = "total"
	streamsEvicted        = "evicted"
	streamsMessageTimeout = "message_timeout"
	streamsWatchPerPeer   = "watch_per_peer"
	streamsWatchTotal     = "watch_total"
)

// The causes of a stream's context ending early, for the log of whoever
// reads context.Cause.
var (
	ErrRequestMessageTimeout = errors.New("limit: the request message did not arrive within --request-message-timeout")
	ErrStreamEvicted         = errors.New("limit: cancelled to make room for a stream of an address holding fewer, the server being at --max-unauthenticated-streams")
	ErrStreamOverCap         = errors.New("limit: its request message took its address past --max-unauthenticated-streams-per-peer or the server past --max-unauthenticated-streams")
)

func newStreamMetrics() (*prometheus.CounterVec, prometheus.Gauge) {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshca_streams_refused_total",
		Help: "gRPC streams refused before their handler ran, or cancelled, by meshca's connection guard: past --max-unauthenticated-streams-per-peer on their own or by their message (per_peer) or --max-unauthenticated-streams with no stream to cancel in their place (total); " +
			"cancelled to make room for a newer stream of their address, or of an address holding fewer (evicted), or for want of their request message within --request-message-timeout (message_timeout); " +
			"health watches past their cap per address (watch_per_peer) or in all (watch_total).",
	}, []string{"reason"})
	for _, r := range []string{streamsPerPeer, streamsTotal, streamsEvicted, streamsMessageTimeout, streamsWatchPerPeer, streamsWatchTotal} {
		refused.WithLabelValues(r)
	}
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "meshca_streams_unauthenticated",
		Help: "gRPC streams in progress whose request has not authenticated (yet).",
	})
	return refused, gauge
}

// StreamHeaderUnit is the share of a stream's header list that counts
// as one more stream against the caps of unauthenticated streams: a
// stream costs ~12 KiB with its goroutine, and its header list besides,
// which may be up to --max-header-bytes (64 KiB). A client's usual
// headers (a bound token of 1-2 KiB) are under one unit.
const StreamHeaderUnit = 4 << 10

// streamWeight is what a stream with a header list of headerBytes counts
// against the caps.
func streamWeight(headerBytes int) int { return 1 + max(headerBytes, 0)/StreamHeaderUnit }

// streamCounts are the streams of each address, under the guard's mu.
type streamCounts struct {
	total   int // weight of the streams not yet authenticated
	watches int
	byPeer  map[netip.Addr]*streamPeer
	heavy   *heaviest[netip.Addr] // weight of each address's streams not yet authenticated
}

func (s *streamCounts) init() {
	s.byPeer = map[netip.Addr]*streamPeer{}
	s.heavy = newHeaviest[netip.Addr]()
}

type streamPeer struct {
	unauthed list.List // of *guardedStream, oldest first
	weight   int       // of unauthed
	watches  int
}

func (s *streamCounts) peer(a netip.Addr) *streamPeer {
	p := s.byPeer[a]
	if p == nil {
		p = &streamPeer{}
		s.byPeer[a] = p
	}
	return p
}

// forget drops a's entry once it holds nothing.
func (s *streamCounts) forget(a netip.Addr, p *streamPeer) {
	s.heavy.set(a, p.weight)
	if p.unauthed.Len() == 0 && p.watches == 0 {
		delete(s.byPeer, a)
	}
}

// The states of a stream's request message.
const (
	msgWaiting int32 = iota
	msgReceived
	msgLate
)

// guardedStream is a stream admitted by AdmitStream.
type guardedStream struct {
	g      *ConnGuard
	c      *guardedConn
	cancel context.CancelCauseFunc
	timer  *time.Timer // the request message deadline; nil when off
	msg    atomic.Int32
	weight int

	// Under g.mu: its element in its address's unauthenticated streams
	// (nil once it is not counted), and whether it holds a watch.
	unauthed *list.Element
	watching bool
}

// AdmitStream admits a stream whose headers (headerBytes of them, as
// HTTP/2 counts a header list) just arrived on the connection of ctx, as
// grpc-go's tap (grpc.InTapHandle), before grpc-go spends a goroutine on
// it. It returns the stream's context, which ends when the stream does,
// when its request message has not arrived within RequestMessageTimeout
// (ErrRequestMessageTimeout), or when it is cancelled to make room
// (ErrStreamEvicted); or an *ExhaustedError when the stream's address
// is at MaxUnauthenticatedStreamsPerPeer, or the server at
// MaxUnauthenticatedStreams with no stream of an address holding more
// to cancel. A stream counts once, and once more for each
// StreamHeaderUnit of its headers and, once it is in, of its message
// (received), until its request authenticates
// (ConnAuthenticated) or it ends. Streams of connections the guard did
// not admit are let through untouched.
func (g *ConnGuard) AdmitStream(ctx context.Context, headerBytes int) (context.Context, error) {
	c, ok := ctx.Value(connKey{}).(*guardedConn)
	if !ok {
		return ctx, nil
	}
	s := &guardedStream{g: g, c: c, weight: streamWeight(headerBytes)}
	g.mu.Lock()
	held := g.streams.peer(c.peer).weight
	reason, evicted := g.makeStreamRoomLocked(c.peer, held, s.weight, true)
	// Making room may have emptied and dropped the address's entry.
	p := g.streams.peer(c.peer)
	if reason != "" {
		err := g.streamsExhausted(reason, c.peer, p.weight)
		g.streams.forget(c.peer, p)
		g.mu.Unlock()
		g.cancelEvicted(evicted)
		g.refuse(g.streamsRefused, "stream refused", reason, c.peer)
		c.streamRefused()
		return nil, err
	}
	ctx, s.cancel = context.WithCancelCause(ctx)
	s.unauthed = p.unauthed.PushBack(s)
	p.weight += s.weight
	g.streams.total += s.weight
	g.streams.heavy.set(c.peer, p.weight)
	g.unauthStreams.Inc()
	g.mu.Unlock()
	g.cancelEvicted(evicted)
	if d := g.lim.RequestMessageTimeout; d > 0 {
		s.timer = time.AfterFunc(d, s.late)
	}
	context.AfterFunc(ctx, s.end)
	return context.WithValue(ctx, streamKey{}, s), nil
}

// makeStreamRoomLocked finds room for a stream of weight w from peer,
// whose streams weigh held: it returns why there is none, or the streams
// it took out of the counts to make room, for the caller to cancel. At
// the address's own cap a new stream (evictOwn) takes the place of the
// address's oldest: an address may be shared (a NAT, hostNetwork Pods),
// and a neighbour holding the cap with requests that never authenticate
// must not keep out a request that would, which authenticates within
// milliseconds and stops counting; a stream too heavy for the cap alone,
// or a message arriving past it, is refused instead.
func (g *ConnGuard) makeStreamRoomLocked(peer netip.Addr, held, w int, evictOwn bool) (reason string, evicted []*guardedStream) {
	lim := g.lim
	if most := lim.MaxUnauthenticatedStreamsPerPeer; most > 0 && held+w > most {
		if !evictOwn || w > most {
			return streamsPerPeer, nil
		}
		for held+w > most {
			e := g.evictOwnLocked(peer)
			if e == nil {
				return streamsPerPeer, evicted
			}
			held -= e.weight
			evicted = append(evicted, e)
		}
	}
	for lim.MaxUnauthenticatedStreams > 0 && g.streams.total+w > lim.MaxUnauthenticatedStreams {
		e := g.evictStreamLocked(held)
		if e == nil {
			// Those taken already are cancelled all the same (they were
			// of addresses holding more than this one).
			return streamsTotal, evicted
		}
		evicted = append(evicted, e)
	}
	return "", evicted
}

// cancelEvicted cancels the streams makeStreamRoomLocked took out of the
// counts. Each counts against its connection as a refused stream does
// until the connection authenticates: a connection whose streams keep
// being pushed out (a client opening streams that never authenticate,
// as fast as the caps let it) is closed, so that it does not keep what
// grpc-go holds for each of them until the connection ends. An
// authenticated connection is not closed for them (streamEvicted).
func (g *ConnGuard) cancelEvicted(evicted []*guardedStream) {
	for _, e := range evicted {
		e.cancel(ErrStreamEvicted)
		g.refuse(g.streamsRefused, "stream cancelled", streamsEvicted, e.c.peer)
		e.c.streamEvicted()
	}
}

// streamsExhausted is the refusal of a stream from peer, which holds
// held streams, for reason; under g.mu.
func (g *ConnGuard) streamsExhausted(reason string, peer netip.Addr, held int) error {
	if reason == streamsPerPeer {
		return exhausted(ReasonUnauthStreamsPerPeer, fmt.Sprintf("this address already has %d requests in progress that have not authenticated, the most it may, retry in %v",
			held, BusyRetryAfter), BusyRetryAfter, fmt.Errorf("%s: %d streams", peer, held))
	}
	return exhausted(ReasonUnauthStreams, fmt.Sprintf("the CA holds %d requests that have not authenticated, the most it may, this address as many as any, retry in %v",
		g.streams.total, BusyRetryAfter), BusyRetryAfter, fmt.Errorf("%s: %d of %d streams", peer, held, g.streams.total))
}

// evictStreamLocked takes the oldest stream not yet authenticated of the
// address holding the most out of the counts and returns it, if that
// address holds more than held; else nil.
func (g *ConnGuard) evictStreamLocked(held int) *guardedStream {
	peer, n, ok := g.streams.heavy.top()
	if !ok || n <= held {
		return nil
	}
	s := g.streams.byPeer[peer].unauthed.Front().Value.(*guardedStream)
	g.uncountLocked(s)
	return s
}

// evictOwnLocked takes peer's oldest stream not yet authenticated out of
// the counts and returns it; nil when it has none.
func (g *ConnGuard) evictOwnLocked(peer netip.Addr) *guardedStream {
	p := g.streams.byPeer[peer]
	if p == nil || p.unauthed.Len() == 0 {
		return nil
	}
	s := p.unauthed.Front().Value.(*guardedStream)
	g.uncountLocked(s)
	return s
}

// uncountLocked stops counting s as unauthenticated.
func (g *ConnGuard) uncountLocked(s *guardedStream) {
	if s.unauthed == nil {
		return
	}
	p := g.streams.byPeer[s.c.peer]
	p.unauthed.Remove(s.unauthed)
	s.unauthed = nil
	p.weight -= s.weight
	g.streams.total -= s.weight
	g.streams.forget(s.c.peer, p)
	g.unauthStreams.Dec()
}

func (s *guardedStream) uncount() {
	s.g.mu.Lock()
	s.g.uncountLocked(s)
	s.g.mu.Unlock()
}

// authenticated: the stream's request authenticated.
func (s *guardedStream) authenticated() { s.uncount() }

// received stops the request message deadline, the message (of n bytes)
// being in, and counts the message against the caps as it counts the
// headers: a stream waiting to authenticate holds its message too. When
// that takes its address or the server past a cap, with no stream of an
// address holding more to cancel in its place, the stream is cancelled.
func (s *guardedStream) received(n int) {
	if s.msg.CompareAndSwap(msgWaiting, msgReceived) && s.timer != nil {
		s.timer.Stop()
	}
	extra := max(n, 0) / StreamHeaderUnit
	if extra == 0 {
		return
	}
	g := s.g
	g.mu.Lock()
	if s.unauthed == nil {
		g.mu.Unlock()
		return
	}
	p := g.streams.byPeer[s.c.peer]
	reason, evicted := g.makeStreamRoomLocked(s.c.peer, p.weight, extra, false)
	if reason == "" {
		s.weight += extra
		p.weight += extra
		g.streams.total += extra
		g.streams.heavy.set(s.c.peer, p.weight)
	} else {
		g.uncountLocked(s)
	}
	g.mu.Unlock()
	g.cancelEvicted(evicted)
	if reason != "" {
		s.cancel(ErrStreamOverCap)
		g.refuse(g.streamsRefused, "stream cancelled", reason, s.c.peer)
	}
}

// late cancels a stream whose request message has not arrived.
func (s *guardedStream) late() {
	if s.msg.CompareAndSwap(msgWaiting, msgLate) {
		s.cancel(ErrRequestMessageTimeout)
		s.g.refuse(s.g.streamsRefused, "stream cancelled", streamsMessageTimeout, s.c.peer)
	}
}

// end forgets the stream, once it has ended.
func (s *guardedStream) end() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.uncount()
	s.g.mu.Lock()
	if s.watching {
		s.watching = false
		s.g.streams.watches--
		p := s.g.streams.byPeer[s.c.peer]
		p.watches--
		s.g.streams.forget(s.c.peer, p)
	}
	s.g.mu.Unlock()
}

// AdmitWatch takes one of the health watches of the stream of ctx's
// address (MaxHealthWatchesPerPeer) and of the server
// (MaxHealthWatches), or refuses with an *ExhaustedError. The watch is
// held until the stream ends. Without a guarded stream it admits.
func AdmitWatch(ctx context.Context) error {
	s, ok := ctx.Value(streamKey{}).(*guardedStream)
	if !ok {
		return nil
	}
	g := s.g
	g.mu.Lock()
	p := g.streams.peer(s.c.peer)
	var err error
	reason := ""
	switch lim := g.lim; {
	case s.watching:
	case lim.MaxHealthWatchesPerPeer > 0 && p.watches >= lim.MaxHealthWatchesPerPeer:
		reason = streamsWatchPerPeer
		err = exhausted(ReasonWatchesPerPeer, fmt.Sprintf("this address already watches the health service %d times, the most it may; use Check", p.watches),
			time.Second, nil)
	case lim.MaxHealthWatches > 0 && g.streams.watches >= lim.MaxHealthWatches:
		reason = streamsWatchTotal
		err = exhausted(ReasonWatches, fmt.Sprintf("the health service has %d watchers, the most it serves; use Check", g.streams.watches),
			time.Second, nil)
	default:
		s.watching = true
		p.watches++
		g.streams.watches++
	}
	g.streams.forget(s.c.peer, p)
	g.mu.Unlock()
	if err != nil {
		g.refuse(g.streamsRefused, "stream refused", reason, s.c.peer)
	}
	return err
}
