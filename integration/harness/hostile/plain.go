package hostile

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// silent opens a TCP connection and sends nothing. The server let it in
// if it has not closed it within RefusedWithin.
func (a *Attacker) silent(ctx context.Context, target string, from net.IP, cn *conn) (bool, error) {
	c, stop, err := dial(ctx, target, from)
	if err != nil {
		return false, err
	}
	defer stop()
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(RefusedWithin))
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, readErr(err)
	}
	_ = c.SetReadDeadline(time.Time{})
	cn.established()
	return true, hold(c, nil)
}

// halfTLS sends a ClientHello and then nothing: the server let it in
// once it answers.
func (a *Attacker) halfTLS(ctx context.Context, target string, from net.IP, cn *conn) (bool, error) {
	c, stop, err := dial(ctx, target, from)
	if err != nil {
		return false, err
	}
	defer stop()
	defer c.Close()
	if _, err := c.Write(a.hello); err != nil {
		return false, err
	}
	buf := make([]byte, 4096)
	if _, err := c.Read(buf); err != nil {
		return false, readErr(err)
	}
	cn.established()
	return true, hold(c, buf)
}

// adminIdle makes one request on a keep-alive connection to the admin
// port and then leaves the connection idle: the server let it in once
// it answers.
func (a *Attacker) adminIdle(ctx context.Context, target string, from net.IP, cn *conn) (bool, error) {
	c, stop, err := dial(ctx, target, from)
	if err != nil {
		return false, err
	}
	defer stop()
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nUser-Agent: attack\r\n\r\n", target); err != nil {
		return false, err
	}
	br := bufio.NewReaderSize(c, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false, readErr(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return false, readErr(err)
	}
	cn.established()
	return true, hold(br, nil)
}

// hold reads (and drops) whatever the server sends until it closes the
// connection, and returns how it closed it.
func hold(r io.Reader, buf []byte) error {
	if buf == nil {
		buf = make([]byte, 512)
	}
	for {
		if _, err := r.Read(buf); err != nil {
			return readErr(err)
		}
	}
}

// readErr names a clean close by the server, which io.EOF does not say.
func readErr(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("closed by the server (EOF)")
	}
	return err
}

// clientHello is the first flight of a TLS client with cfg: one record
// holding its ClientHello, the same for every HalfTLS connection.
func clientHello(cfg *tls.Config) ([]byte, error) {
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		defer client.Close()
		_ = tls.Client(client, cfg).Handshake()
	}()
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(server, hdr); err != nil {
		return nil, fmt.Errorf("hostile: ClientHello: %w", err)
	}
	rec := make([]byte, 5+(int(hdr[3])<<8|int(hdr[4])))
	copy(rec, hdr)
	if _, err := io.ReadFull(server, rec[5:]); err != nil {
		return nil, fmt.Errorf("hostile: ClientHello: %w", err)
	}
	return rec, nil
}
