package ca_test

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/limit"
	"github.com/meshca/meshca/internal/testca"
	"golang.org/x/net/http2"
)

// h2conn is a bare HTTP/2 client connection: what an idle ztunnel holds.
type h2conn struct {
	conn net.Conn
	fr   *http2.Framer
	// streams is the server's SETTINGS_MAX_CONCURRENT_STREAMS, 0 if unset.
	streams uint32
}

func dialH2(t *testing.T, f *fixture) *h2conn {
	t.Helper()
	conn, err := tls.Dial("tcp", f.addr, &tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc",
		NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	c := &h2conn{conn: conn, fr: http2.NewFramer(conn, conn)}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// readUntil reads frames until a GOAWAY or the deadline, answering the
// server's SETTINGS; it returns the GOAWAY, or nil.
func (c *h2conn) readUntil(t *testing.T, deadline time.Time) *http2.GoAwayFrame {
	t.Helper()
	_ = c.conn.SetReadDeadline(deadline)
	for {
		fr, err := c.fr.ReadFrame()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			t.Fatalf("reading frames: %v", err)
		}
		switch fr := fr.(type) {
		case *http2.SettingsFrame:
			if !fr.IsAck() {
				if v, ok := fr.Value(http2.SettingMaxConcurrentStreams); ok {
					c.streams = v
				}
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.GoAwayFrame:
			return fr
		}
	}
}

// TestConnLimitsReachTheTransport: ConnLimits are what a client sees on
// the wire: the streams it may open, an idle connection closed, pings
// tolerated at the allowed interval and not more often, even on a
// connection without a request.
func TestConnLimitsReachTheTransport(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	tests := []struct {
		name     string
		conn     limit.ConnLimits
		pings    int           // pings the client sends, every interval
		every    time.Duration // between pings
		wait     time.Duration // how long the client watches for a GOAWAY
		streams  uint32
		noGoAway bool // no GOAWAY expected; else goAway and debug
		goAway   http2.ErrCode
		debug    string
	}{
		{name: "defaults: 256 streams, an idle connection stays", wait: time.Second, streams: 256, noGoAway: true},
		{name: "idle connection closed", conn: limit.ConnLimits{MaxConnectionIdle: 300 * time.Millisecond, MaxConcurrentStreams: 7},
			wait: 5 * time.Second, streams: 7, goAway: http2.ErrCodeNo, debug: "max_idle"},
		{name: "pings too often", conn: limit.ConnLimits{KeepaliveMinTime: time.Minute},
			pings: 5, every: 20 * time.Millisecond, wait: 5 * time.Second, streams: 256, goAway: http2.ErrCodeEnhanceYourCalm, debug: "too_many_pings"},
		{name: "pings at the tolerated interval, without a request", conn: limit.ConnLimits{KeepaliveMinTime: 100 * time.Millisecond},
			pings: 5, every: 300 * time.Millisecond, wait: 500 * time.Millisecond, streams: 256, noGoAway: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, root.Authority(), options{config: func(c *ca.Config) { c.Conn = tt.conn }})
			c := dialH2(t, f)
			for i := range tt.pings {
				if i > 0 {
					time.Sleep(tt.every)
				}
				if err := c.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
					t.Fatal(err)
				}
			}
			ga := c.readUntil(t, time.Now().Add(tt.wait))
			if c.streams != tt.streams {
				t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", c.streams, tt.streams)
			}
			switch {
			case tt.noGoAway && ga != nil:
				t.Fatalf("GOAWAY %v %q, want none", ga.ErrCode, ga.DebugData())
			case tt.noGoAway:
			case ga == nil:
				t.Fatalf("no GOAWAY within %v, want %v", tt.wait, tt.goAway)
			case ga.ErrCode != tt.goAway || string(ga.DebugData()) != tt.debug:
				t.Fatalf("GOAWAY %v %q, want %v %q", ga.ErrCode, ga.DebugData(), tt.goAway, tt.debug)
			}
		})
	}
}
