package e2e

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// connChecks: connection floods past --max-connections-per-peer (4 in
// the budget arena) and --max-connections (20), and HTTP/2 used against
// its peer.
func (b *arena) connChecks(t *testing.T) []check {
	other := cluster.NewWorkload(t, b.apps, "other", "node-a")
	after := cluster.NewWorkload(t, b.apps, "after", "node-a")
	later := cluster.NewWorkload(t, b.apps, "later", "node-a")
	b.secret(other.Token, after.Token, later.Token)
	return []check{
		{name: "connections/one address past its connections", defence: "conn:per_peer_cap", run: func(t *testing.T) {
			held := b.hold(t, 4, func(int) string { return "127.0.0.4" })
			b.turnedAway(t, "127.0.0.4", "per_peer")
			b.served(t, other, "127.0.0.5") // another address is not held up
			closeAll(held)
			b.servedSoon(t, after, "127.0.0.4")
		}},
		{name: "connections/all clients past the total", defence: "conn:total_cap", run: func(t *testing.T) {
			held := b.hold(t, 20, func(i int) string { return fmt.Sprintf("127.0.1.%d", 1+i/4) })
			b.turnedAway(t, "127.0.2.1", "total")
			closeAll(held)
			b.servedSoon(t, later, "127.0.2.1")
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
