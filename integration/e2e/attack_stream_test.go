package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The methods a raw stream opens.
const (
	methodCreateCertificate = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
	methodHealthWatch       = "/grpc.health.v1.Health/Watch"
)

// unauthArena's meshca bounds what a peer without credentials holds with
// limits small enough to reach: streams without their message cancelled
// after 3 s, 20 streams not yet authenticated an address (a 60 KiB
// message counts 16) and 40 in all,
// 6 connections an address and 12 in all, 3 s for a TLS handshake, 8 s
// of life for a connection that has not authenticated.
func newUnauthArena(t *testing.T) *arena {
	m := newMesh(t, "--request-message-timeout=3s", "--max-unauthenticated-streams-per-peer=20", "--max-unauthenticated-streams=40",
		"--max-connections=12", "--max-connections-per-peer=6", "--tls-handshake-timeout=3s", "--max-connection-age-unauthenticated=8s")
	return &arena{mesh: m, roots: m.s.roots}
}

// rawH2 is an HTTP/2 connection whose gRPC streams are opened by hand:
// headers, and no message, as a client that stalls (or an attacker)
// sends.
type rawH2 struct {
	c    net.Conn
	fr   *http2.Framer
	next uint32
}

// rawFrom is a rawH2 to a's meshca from the address from, past its TLS
// handshake and HTTP/2 preface.
func (a *arena) rawFrom(t *testing.T, from string) *rawH2 {
	t.Helper()
	c := a.hold(t, 1, func(int) string { return from })[0]
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	return &rawH2{c: c, fr: fr, next: 1}
}

// open opens a stream of method with its headers only (pad bytes more in
// a header of their own) and returns its id.
func (r *rawH2) open(t *testing.T, method string, pad int) uint32 {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: "istiod.istio-system.svc"}, {Name: ":path", Value: method},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}}
	if pad > 0 {
		fields = append(fields, hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", pad), Sensitive: true})
	}
	for _, f := range fields {
		_ = enc.WriteField(f)
	}
	id := r.next
	r.next += 2
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	return id
}

// openN opens n streams of method and returns their ids.
func (r *rawH2) openN(t *testing.T, n int, method string) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = r.open(t, method, 0)
	}
	return ids
}

// rawEnd is how meshca ended a stream: its grpc-status and grpc-message,
// or a RST_STREAM.
type rawEnd struct {
	status, message string
	reset           bool
	at              time.Duration // since ends was called
}

// ends reads frames for up to d, or until every stream of ids has ended,
// and returns how each that did ended.
func (r *rawH2) ends(t *testing.T, ids []uint32, d time.Duration) map[uint32]rawEnd {
	t.Helper()
	want := map[uint32]bool{}
	for _, id := range ids {
		want[id] = true
	}
	got := map[uint32]rawEnd{}
	start := time.Now()
	_ = r.c.SetReadDeadline(start.Add(d))
	for len(want) > 0 {
		f, err := r.fr.ReadFrame()
		if errors.Is(err, os.ErrDeadlineExceeded) || err != nil {
			return got
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = r.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = r.fr.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() && want[f.StreamID] {
				e := rawEnd{at: time.Since(start)}
				for _, hf := range f.RegularFields() {
					switch hf.Name {
					case "grpc-status":
						e.status = hf.Value
					case "grpc-message":
						e.message = hf.Value
					}
				}
				got[f.StreamID] = e
				delete(want, f.StreamID)
			}
		case *http2.RSTStreamFrame:
			if want[f.StreamID] {
				got[f.StreamID] = rawEnd{reset: true, at: time.Since(start)}
				delete(want, f.StreamID)
			}
		}
	}
	return got
}

// metric is a series of a's meshca now; -1 when it has none.
func (a *arena) metric(t *testing.T, name, label, value string) float64 {
	return sampleValue(scrapeMetrics(t, a.s.AdminAddr), name, label, value)
}

// awaitMetric waits up to 5 s for a series to reach want.
func (a *arena) awaitMetric(t *testing.T, name, label, value string, want float64) {
	t.Helper()
	var got float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got = a.metric(t, name, label, value); got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s{%s=%q} is %v, want %v", name, label, value, got, want)
		}
	}
}

// clientHello is the first TLS record Go's client sends.
func clientHello(t *testing.T) []byte {
	t.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		_ = tls.Client(client, &tls.Config{ServerName: "istiod.istio-system.svc"}).Handshake()
		client.Close()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(server, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(server, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// closedIn reports how long the server took to close c, reading until
// then, or false after d.
func closedIn(c net.Conn, d time.Duration) (time.Duration, bool) {
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(d))
	buf := make([]byte, 1024)
	for {
		if _, err := c.Read(buf); err != nil {
			return time.Since(start), !errors.Is(err, os.ErrDeadlineExceeded)
		}
	}
}

// watchFrom starts a health Watch of service from the address from and
// returns its first answer or its error; the stream stays open until
// the test ends, 30 s at most.
func (a *arena) watchFrom(t *testing.T, from, service string) (healthpb.Health_WatchClient, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	w, err := healthpb.NewHealthClient(a.connFrom(t, from)).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return nil, err
	}
	_, err = w.Recv()
	return w, err
}

// wantStatus checks err's code and message.
func wantStatus(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if st := status.Convert(err); st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("%s: %v %q, want %v containing %q", what, st.Code(), st.Message(), code, msg)
	}
}
