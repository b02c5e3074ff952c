package e2e

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// connChecks: connection floods past --max-connections-per-peer (4 in
// the budget arena) and --max-connections (20), and HTTP/2 used against
// its peer; then, against a meshca of their own, what a peer without
// credentials can hold (unauthChecks).
func (b *arena) connChecks(t *testing.T) []check {
	other := cluster.NewWorkload(t, b.apps, "other", "node-a")
	after := cluster.NewWorkload(t, b.apps, "after", "node-a")
	later := cluster.NewWorkload(t, b.apps, "later", "node-a")
	b.secret(other.Token, after.Token, later.Token)
	return append([]check{
		{name: "connections/one address past its connections", defence: "conn:per_peer_cap", run: func(t *testing.T) {
			held := b.hold(t, 4, func(int) string { return "127.0.0.4" })
			b.turnedAway(t, "127.0.0.4", "per_peer")
			b.served(t, other, "127.0.0.5") // another address is not held up
			closeAll(held)
			b.servedSoon(t, after, "127.0.0.4")
		}},
		// Full, a newcomer from an address holding fewer would have a
		// connection not yet authenticated closed for it
		// (conn:evicted); one from an address holding as many as any is
		// refused.
		{name: "connections/all clients past the total", defence: "conn:total_cap", run: func(t *testing.T) {
			held := b.hold(t, 20, func(i int) string { return fmt.Sprintf("127.0.1.%d", 1+i/3) }) // 3 each, 2 from 127.0.1.7
			b.turnedAway(t, "127.0.1.1", "total")
			closeAll(held)
			b.servedSoon(t, later, "127.0.1.1")
		}},
		{name: "http2/streams past --max-concurrent-streams", defence: "transport:max_concurrent_streams", run: func(t *testing.T) {
			h := b.dialH2(t)
			for _, id := range []uint32{1, 3, 5} {
				h.headers(t, id)
			}
			f := h.until(t, func(f h2frame) bool { return f.typ == 0x3 })
			if f.stream != 5 || binary.BigEndian.Uint32(f.payload) != 0x7 {
				t.Errorf("RST_STREAM on stream %d, code %d; want stream 5 REFUSED_STREAM (7)", f.stream, binary.BigEndian.Uint32(f.payload))
			}
		}},
		{name: "http2/pings faster than --keepalive-min-time", defence: "transport:too_many_pings", run: func(t *testing.T) {
			h := b.dialH2(t)
			for i := range 5 {
				if err := writeFrame(h.c, 0x6, 0, 0, []byte{0, 0, 0, 0, 0, 0, 0, byte(i)}); err != nil {
					break
				}
			}
			f := h.until(t, func(f h2frame) bool { return f.typ == 0x7 })
			if code := binary.BigEndian.Uint32(f.payload[4:]); code != 0xb || string(f.payload[8:]) != "too_many_pings" {
				t.Errorf("GOAWAY code %d %q, want ENHANCE_YOUR_CALM (11) too_many_pings", code, f.payload[8:])
			}
		}},
	}, slices.Concat(unauthChecks(t), unauthConnChecks(t), cooldownChecks(t))...)
}

// unauthChecks (issue 28, items 1 and 2): a peer without credentials
// holds a bounded number of streams and connections for a bounded time,
// against newUnauthArena's meshca; other clients are served meanwhile.
func unauthChecks(t *testing.T) []check {
	u := newUnauthArena(t)
	workload := func(name string) *harness.Workload {
		w := cluster.NewWorkload(t, u.apps, name, "node-a")
		u.secret(w.Token)
		return w
	}
	stalled, other, newcomer, early := workload("stalled"), workload("other"), workload("newcomer"), workload("early")
	const RE = codes.ResourceExhausted
	return []check{
		{name: "streams/half-open requests past --request-message-timeout", defence: "stream:message_timeout", run: func(t *testing.T) {
			r := u.rawFrom(t, "127.0.3.1")
			ids := append(r.openN(t, 6, methodCreateCertificate), r.open(t, methodHealthWatch, 0))
			before := u.metric(t, "meshca_streams_refused_total", "reason", "message_timeout")
			got := r.ends(t, ids, 8*time.Second)
			for _, id := range ids {
				if e, ok := got[id]; !ok || e.status != "1" || e.at < 2*time.Second {
					t.Errorf("stream %d without its message: %+v, want CANCELLED (1) at the 3s deadline", id, e)
				}
			}
			u.awaitMetric(t, "meshca_streams_refused_total", "reason", "message_timeout", before+float64(len(ids)))
			u.awaitMetric(t, "meshca_streams_unauthenticated", "", "", 0)
			u.served(t, stalled, "127.0.3.1")
		}},
		{name: "health/Watch of a 60 KiB service name", defence: "health:watch_unknown_service", run: func(t *testing.T) {
			start := time.Now()
			_, err := u.watchFrom(t, "127.0.3.2", strings.Repeat("x", 60<<10))
			wantStatus(t, "a Watch of a 60 KiB name", err, codes.NotFound, "unknown service")
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("refused after %v, want at once", took)
			}
		}},
		{name: "health/watches past the address's cap", defence: "health:watch_per_peer_cap", run: func(t *testing.T) {
			for i := range 4 {
				if _, err := u.watchFrom(t, "127.0.3.3", ""); err != nil {
					t.Fatalf("watch %d of 4: %v", i+1, err)
				}
			}
			_, err := u.watchFrom(t, "127.0.3.3", "istio.v1.auth.IstioCertificateService")
			wantStatus(t, "a fifth watch from one address", err, RE, "this address already watches the health service 4 times, the most it may; use Check")
			if _, err := healthpb.NewHealthClient(u.connFrom(t, "127.0.3.3")).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("Check from the address: %v", err)
			}
		}},
		{name: "streams/one address past --max-unauthenticated-streams-per-peer", defence: "stream:per_peer_evicted", run: func(t *testing.T) {
			r1, r2 := u.rawFrom(t, "127.0.3.4"), u.rawFrom(t, "127.0.3.4")
			// Each batch is counted before the next is sent, so that the
			// server, which reads the two connections concurrently, sees
			// r1's first stream first and the 21st last.
			oldest := r1.openN(t, 12, methodCreateCertificate)
			u.awaitMetric(t, "meshca_streams_unauthenticated", "", "", 12)
			r2.openN(t, 8, methodCreateCertificate)
			u.awaitMetric(t, "meshca_streams_unauthenticated", "", "", 20)
			// A 21st stream takes the place of the address's oldest, which
			// is cancelled: the address holds 20 at most, and a neighbour
			// holding them cannot keep out a request that authenticates.
			id := r2.open(t, methodCreateCertificate, 0)
			if e, ok := r1.ends(t, oldest[:1], 2*time.Second)[oldest[0]]; !ok || e.status != "1" {
				t.Fatalf("the address's oldest stream when a 21st came: %+v, want CANCELLED (1)", e)
			}
			if got := r2.ends(t, []uint32{id}, 300*time.Millisecond); len(got) > 0 {
				t.Fatalf("the 21st stream: %+v, want it open", got)
			}
			u.served(t, other, "127.0.3.5")
			// A client at that address with a good token is served too.
			u.served(t, other, "127.0.3.4")
		}},
		{name: "streams/addresses past --max-unauthenticated-streams", defence: "stream:total_evicted", run: func(t *testing.T) {
			a, b, c := u.rawFrom(t, "127.0.3.6"), u.rawFrom(t, "127.0.3.7"), u.rawFrom(t, "127.0.3.8")
			aIDs, bIDs := a.openN(t, 17, methodCreateCertificate), b.openN(t, 17, methodCreateCertificate)
			c.openN(t, 6, methodCreateCertificate)
			u.awaitMetric(t, "meshca_streams_unauthenticated", "", "", 40)
			// 127.0.3.7 holds as many as any: refused.
			id := b.open(t, methodCreateCertificate, 0)
			if e := b.ends(t, []uint32{id}, 2*time.Second)[id]; e.status != "8" || !strings.Contains(e.message, "the CA holds 40 requests that have not authenticated") {
				t.Fatalf("a stream from the address holding the most: %+v, want RESOURCE_EXHAUSTED (8)", e)
			}
			evicted := u.metric(t, "meshca_streams_refused_total", "reason", "evicted")
			// An address holding none is served: the oldest stream of
			// 127.0.3.6 or 127.0.3.7 makes room.
			u.served(t, newcomer, "127.0.3.9")
			if now := u.metric(t, "meshca_streams_refused_total", "reason", "evicted"); now <= evicted {
				t.Errorf("meshca_streams_refused_total{reason=evicted} stayed at %v", now)
			}
			ea, eb := a.ends(t, aIDs[:1], 500*time.Millisecond), b.ends(t, bIDs[:1], 500*time.Millisecond)
			if len(ea)+len(eb) != 1 || ea[aIDs[0]].status+eb[bIDs[0]].status != "1" {
				t.Errorf("the oldest streams of the two heaviest addresses: %+v %+v, want one CANCELLED (1)", ea, eb)
			}
		}},
		{name: "connections/silent TCP from many addresses past --max-connections", defence: "conn:evicted", run: func(t *testing.T) {
			// The rows before closed their connections; the server must
			// have let them go before the silent ones fill it, or one of
			// those leaving makes room for the client instead of an
			// eviction.
			u.awaitMetric(t, "meshca_connections_open", "", "", 0)
			var silent []net.Conn
			t.Cleanup(func() { closeAll(silent) })
			for i := range 12 {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.4.%d", 1+i/6))}}
				if c, err := d.Dial("tcp", u.s.Addr); err == nil {
					silent = append(silent, c)
				}
			}
			u.awaitMetric(t, "meshca_connections_open", "", "", 12)
			evicted := u.metric(t, "meshca_connections_refused_total", "reason", "evicted")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := u.send(ctx, u.own(t, early, "127.0.4.3")); err != nil {
				t.Fatalf("a client from a third address with the connections full of silent ones: %v, want served at once", err)
			}
			if now := u.metric(t, "meshca_connections_refused_total", "reason", "evicted"); now <= evicted {
				t.Errorf("meshca_connections_refused_total{reason=evicted} stayed at %v", now)
			}
		}},
		{name: "tls/a ClientHello that stops halfway", defence: "conn:handshake_timeout", run: func(t *testing.T) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.4.4")}}
			c, err := d.Dial("tcp", u.s.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			before := u.metric(t, "meshca_connections_refused_total", "reason", "handshake_timeout")
			hello := clientHello(t)
			if _, err := c.Write(hello[:len(hello)/2]); err != nil {
				t.Fatal(err)
			}
			if took, ok := closedIn(c, 10*time.Second); !ok || took < 2*time.Second || took > 6*time.Second {
				t.Fatalf("half a ClientHello: closed %v after %v, want closed at the 3s handshake timeout", ok, took)
			}
			if now := u.metric(t, "meshca_connections_refused_total", "reason", "handshake_timeout"); now <= before {
				t.Errorf("meshca_connections_refused_total{reason=handshake_timeout} stayed at %v", now)
			}
		}},
		{name: "connections/a health watch past --max-connection-age-unauthenticated", defence: "conn:unauthenticated_age", run: func(t *testing.T) {
			start := time.Now()
			w, err := u.watchFrom(t, "127.0.4.5", "")
			if err != nil {
				t.Fatal(err)
			}
			for err == nil {
				_, err = w.Recv()
			}
			if took := time.Since(start); status.Code(err) != codes.Unavailable || took < 6*time.Second || took > 14*time.Second {
				t.Fatalf("a watch without credentials: %v after %v, want its connection closed at its age of 8s", err, took)
			}
		}},
	}
}

// hold opens n connections, the i-th from address from(i), each past its
// TLS handshake and HTTP/2 preface, as an idle gRPC client's.
func (b *arena) hold(t *testing.T, n int, from func(i int) string) []net.Conn {
	var held []net.Conn
	t.Cleanup(func() { closeAll(held) })
	for i := range n {
		d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from(i))}},
			Config: &tls.Config{RootCAs: b.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}}}
		c, err := d.DialContext(context.Background(), "tcp", b.s.Addr)
		if err != nil {
			t.Fatalf("connection %d of %d from %s: %v", i+1, n, from(i), err)
		}
		held = append(held, c)
		if err := h2Preface(c); err != nil {
			t.Fatalf("connection %d of %d from %s: %v", i+1, n, from(i), err)
		}
	}
	return held
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// turnedAway: a request from the address from gets no connection, and
// so no answer, within 3 s; meshca counts the connection it closed in
// meshca_connections_refused_total{reason}.
func (b *arena) turnedAway(t *testing.T, from, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	refusals := func() float64 {
		return sampleValue(scrapeMetrics(t, b.s.AdminAddr), "meshca_connections_refused_total", "reason", reason)
	}
	closed := refusals()
	before := b.counters(t)
	_, err := b.send(ctx, probe{token: b.web.Token, from: from, req: &authpb.IstioCertificateRequest{Csr: newCSR(t, b.webID)}})
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Errorf("a connection past the cap: %v, want none (Unavailable or no answer)", err)
	}
	if after := b.counters(t); after.requests != before.requests || after.issued != before.issued {
		t.Errorf("the request past the cap reached meshca's handler: %+v then %+v", before, after)
	}
	if now := refusals(); now <= closed {
		t.Errorf("meshca_connections_refused_total{reason=%q} stayed at %v", reason, now)
	}
}

// servedSoon: once connections close, the cap frees up within a few
// seconds for w's request from the address from.
func (b *arena) servedSoon(t *testing.T, w *harness.Workload, from string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := b.send(ctx, b.own(t, w, from))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request from %s served after the connections closed: %v", from, err)
		}
	}
}

// h2conn is an HTTP/2 connection spoken by hand, as an attacker would.
type h2conn struct{ c net.Conn }

// h2frame is one frame read.
type h2frame struct {
	typ     byte
	stream  uint32
	payload []byte
}

func h2Preface(c net.Conn) error {
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		return err
	}
	return writeFrame(c, 0x4, 0, 0, nil) // SETTINGS
}

func (b *arena) dialH2(t *testing.T) *h2conn {
	held := b.hold(t, 1, func(int) string { return "127.0.0.1" })
	_ = held[0].SetDeadline(time.Now().Add(10 * time.Second))
	return &h2conn{c: held[0]}
}

// headers opens stream id with a CreateCertificate's headers, and sends
// no message: the stream stays open.
func (h *h2conn) headers(t *testing.T, id uint32) {
	t.Helper()
	var block []byte
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "istiod.istio-system.svc"},
		{":path", "/istio.v1.auth.IstioCertificateService/CreateCertificate"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		block = hpackLiteral(block, kv[0], kv[1])
	}
	if err := writeFrame(h.c, 0x1, 0x4, id, block); err != nil { // HEADERS, END_HEADERS
		t.Fatal(err)
	}
}

// until reads frames, acknowledging the server's SETTINGS, until want
// says one is the frame looked for.
func (h *h2conn) until(t *testing.T, want func(h2frame) bool) h2frame {
	t.Helper()
	var seen []string
	hdr := make([]byte, 9)
	for {
		if _, err := io.ReadFull(h.c, hdr); err != nil {
			t.Fatalf("connection ended (%v) after frames %s", err, strings.Join(seen, " "))
		}
		f := h2frame{typ: hdr[3], stream: binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff,
			payload: make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))}
		if _, err := io.ReadFull(h.c, f.payload); err != nil {
			t.Fatalf("connection ended (%v) after frames %s", err, strings.Join(seen, " "))
		}
		seen = append(seen, fmt.Sprintf("%d/%d", f.typ, f.stream))
		if want(f) {
			return f
		}
		if f.typ == 0x4 && hdr[4]&0x1 == 0 {
			_ = writeFrame(h.c, 0x4, 0x1, 0, nil) // SETTINGS ACK
		}
	}
}
