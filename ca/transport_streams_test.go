package ca_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/limit"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The methods a raw stream opens.
const (
	createCertificate = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
	healthWatch       = "/grpc.health.v1.Health/Watch"
)

// dialH2From is dialH2 from the source address from (any 127.0.0.0/8
// address is local on Linux), its frames' header blocks decoded.
func dialH2From(t *testing.T, f *fixture, from string) *h2conn {
	t.Helper()
	d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}},
		Config: &tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}}
	conn, err := d.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	c := &h2conn{conn: conn, fr: http2.NewFramer(conn, conn)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// open sends the headers of a call of method on stream id and nothing
// else: no message, the stream left open, as a client that stalls does.
// pad adds a header of that many bytes; timeout, when set, is the
// call's grpc-timeout.
func (c *h2conn) open(t *testing.T, id uint32, method string, pad int, timeout string) {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: "istiod.istio-system.svc"}, {Name: ":path", Value: method},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}}
	if pad > 0 {
		fields = append(fields, hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", pad), Sensitive: true})
	}
	if timeout != "" {
		fields = append(fields, hpack.HeaderField{Name: "grpc-timeout", Value: timeout})
	}
	for _, hf := range fields {
		if err := enc.WriteField(hf); err != nil {
			t.Fatal(err)
		}
	}
	b := block.Bytes()
	const frame = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
	first := b[:min(len(b), frame)]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(b) <= frame}); err != nil {
		t.Fatal(err)
	}
	for b = b[len(first):]; len(b) > 0; {
		n := min(len(b), frame)
		if err := c.fr.WriteContinuation(id, n == len(b), b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
}

// streamEnd is how the server ended a stream: its grpc-status and
// grpc-message, or its RST_STREAM code.
type streamEnd struct {
	status, message string
	details         bool // a grpc-status-details-bin
	rst             http2.ErrCode
	reset           bool
}

// ends reads frames until every stream of ids has ended or the
// deadline, and returns how each that did ended. A connection closed
// ends the reading.
func (c *h2conn) ends(t *testing.T, ids []uint32, deadline time.Time) map[uint32]streamEnd {
	t.Helper()
	want := map[uint32]bool{}
	for _, id := range ids {
		want[id] = true
	}
	got := map[uint32]streamEnd{}
	_ = c.conn.SetReadDeadline(deadline)
	for len(want) > 0 {
		fr, err := c.fr.ReadFrame()
		if errors.Is(err, os.ErrDeadlineExceeded) || err != nil {
			return got
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if fr.StreamEnded() && want[fr.StreamID] {
				{
					got[fr.StreamID] = streamEnd{status: headerValue(fr, "grpc-status"), message: headerValue(fr, "grpc-message"),
						details: headerValue(fr, "grpc-status-details-bin") != ""}
					delete(want, fr.StreamID)
				}
			}
		case *http2.RSTStreamFrame:
			if want[fr.StreamID] {
				got[fr.StreamID] = streamEnd{rst: fr.ErrCode, reset: true}
				delete(want, fr.StreamID)
			}
		}
	}
	return got
}

func headerValue(fr *http2.MetaHeadersFrame, name string) string {
	for _, hf := range fr.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// ids are the client stream ids first, first+2, ... n of them.
func ids(first uint32, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = first + 2*uint32(i)
	}
	return s
}

// TestRequestMessageTimeout: a stream whose request message does not
// come within RequestMessageTimeout is cancelled, CreateCertificate and
// health Watch alike, and the goroutine each held is freed; a client
// that sends its request is served as before.
func TestRequestMessageTimeout(t *testing.T) {
	const n = 40
	f, reg := guardedFixture(t, limit.ConnLimits{RequestMessageTimeout: 300 * time.Millisecond, MaxUnauthenticatedIdle: limit.NoLimit})
	before := runtime.NumGoroutine()
	var conns []*h2conn
	var all [][]uint32
	for i := range 2 {
		c := dialH2(t, f)
		c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		s := ids(1, n/2)
		for j, id := range s {
			method := createCertificate
			if j%4 == 3 {
				method = healthWatch
			}
			c.open(t, id, method, 0, map[bool]string{true: "30S"}[i == 1])
		}
		conns, all = append(conns, c), append(all, s)
	}
	waitFor(t, 5*time.Second, func() bool { return runtime.NumGoroutine()-before >= n }, "a goroutine for each stream")
	for i, c := range conns {
		got := c.ends(t, all[i], time.Now().Add(5*time.Second))
		for _, id := range all[i] {
			if e, ok := got[id]; !ok || e.status != "1" {
				t.Errorf("connection %d stream %d: %+v, want grpc-status 1 (CANCELLED) within 5s of a 300ms deadline", i, id, e)
			}
		}
	}
	waitSample(t, reg, "meshca_streams_unauthenticated", nil, 0)
	// A stream's cancellation reaches the client before its handler
	// returns and counts it: wait for the count rather than read it.
	waitSample(t, reg, "meshca_streams_refused_total", map[string]string{"reason": "message_timeout"}, n)
	waitFor(t, 5*time.Second, func() bool { return runtime.NumGoroutine()-before < 8 }, "the streams' goroutines to end")
	good := f.client(t, "good", nil)
	if _, err := good.Fetch(context.Background(), frontend, caclient.Options{}); err != nil {
		t.Fatalf("a client sending its request at once: %v", err)
	}
	wantSample(t, reg, "meshca_streams_refused_total", map[string]string{"reason": "message_timeout"}, n)
}

// waitFor polls ok until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, ok func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

// waitSample waits up to 5s for a series to reach want.
func waitSample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64) {
	t.Helper()
	var got float64
	waitFor(t, 5*time.Second, func() bool { got, _ = sample(t, reg, name, labels); return got == want },
		fmt.Sprintf("%s%v at %v to reach %v", name, labels, got, want))
}

// TestUnauthenticatedStreamsOnTheWire: a stream past its address's cap
// of unauthenticated streams, on any of its connections, is refused with
// ResourceExhausted, a message saying why and when to retry and a
// RetryInfo detail, as a trailers-only answer, before any goroutine is
// spent on it; another address is not held up; a request that
// authenticated no longer counts.
func TestUnauthenticatedStreamsOnTheWire(t *testing.T) {
	f, reg := guardedFixture(t, limit.ConnLimits{MaxUnauthenticatedStreamsPerPeer: 3, RequestMessageTimeout: time.Minute})
	c1, c2, other := dialH2From(t, f, "127.0.0.1"), dialH2From(t, f, "127.0.0.1"), dialH2From(t, f, "127.0.0.2")
	idle := runtime.NumGoroutine()
	for _, id := range ids(1, 2) {
		c1.open(t, id, createCertificate, 0, "")
	}
	c2.open(t, 1, healthWatch, 0, "")
	waitFor(t, 5*time.Second, func() bool { return runtime.NumGoroutine()-idle >= 3 }, "the three streams' goroutines")
	before := runtime.NumGoroutine()
	// A stream heavier than the cap on its own (its headers) is refused.
	for _, c := range []*h2conn{c1, c2} {
		c.open(t, 5, createCertificate, 3*limit.StreamHeaderUnit, "30S")
		e, ok := c.ends(t, []uint32{5}, time.Now().Add(5*time.Second))[5]
		if !ok || e.status != "8" || e.message != "this address already has 3 requests in progress that have not authenticated, the most it may, retry in 250ms" || !e.details {
			t.Fatalf("a stream past the cap: %+v, want grpc-status 8 (RESOURCE_EXHAUSTED), the message and its RetryInfo", e)
		}
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Errorf("%d goroutines more for two refused streams", n-before)
	}
	other.open(t, 1, createCertificate, 0, "")
	if got := other.ends(t, []uint32{1}, time.Now().Add(300*time.Millisecond)); len(got) > 0 {
		t.Fatalf("a stream of another address: %+v, want it open", got)
	}
	wantSample(t, reg, "meshca_streams_refused_total", map[string]string{"reason": "per_peer"}, 2)
	wantSample(t, reg, "meshca_streams_unauthenticated", nil, 4)
	// A stream of usual weight at the cap takes the place of the
	// address's oldest, which is cancelled: a neighbour's requests that
	// never authenticate cannot keep out one that would.
	c2.open(t, 7, createCertificate, 0, "30S")
	// The oldest is c1's first or c2's watch: the two connections' first
	// streams race to the guard.
	e1 := c1.ends(t, []uint32{1}, time.Now().Add(2*time.Second))
	e2 := c2.ends(t, []uint32{1}, time.Now().Add(500*time.Millisecond))
	cancelled := func(m map[uint32]streamEnd) bool { e, ok := m[1]; return ok && (e.status == "1" || e.reset) }
	if cancelled(e1) == cancelled(e2) {
		t.Fatalf("the address's oldest streams at its cap: %+v and %+v, want one of them cancelled", e1, e2)
	}
	if got := c2.ends(t, []uint32{7}, time.Now().Add(300*time.Millisecond)); len(got) > 0 {
		t.Fatalf("the newer stream at the cap: %+v, want it open", got)
	}
	wantSample(t, reg, "meshca_streams_refused_total", map[string]string{"reason": "evicted"}, 1)
	wantSample(t, reg, "meshca_streams_unauthenticated", nil, 4)
}

// TestAuthenticatedStreamsDoNotCount: a request that authenticated stops
// counting against its address's unauthenticated streams while it is
// served, so that a ztunnel's requests waiting for their signature do
// not hold its address's place.
func TestAuthenticatedStreamsDoNotCount(t *testing.T) {
	bs := &blockingSigner{started: make(chan struct{}, 1), release: make(chan struct{})}
	f, reg := guardedFixtureWith(t, limit.ConnLimits{MaxUnauthenticatedStreamsPerPeer: 1, RequestMessageTimeout: time.Minute}, options{signer: bs})
	good := f.client(t, "good", nil) // from 127.0.0.1
	done := make(chan error, 1)
	go func() {
		_, err := good.Fetch(context.Background(), frontend, caclient.Options{})
		done <- err
	}()
	<-bs.started
	wantSample(t, reg, "meshca_streams_unauthenticated", nil, 0)
	c := dialH2From(t, f, "127.0.0.1")
	c.open(t, 1, createCertificate, 0, "")
	if got := c.ends(t, []uint32{1}, time.Now().Add(300*time.Millisecond)); len(got) > 0 {
		t.Fatalf("a stream from the address of a request being signed: %+v, want it admitted", got)
	}
	wantSample(t, reg, "meshca_streams_unauthenticated", nil, 1)
	close(bs.release)
	<-done
}
