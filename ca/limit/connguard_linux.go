package limit

import (
	"net"
	"syscall"
	"time"
)

// tcpUserTimeout is TCP_USER_TIMEOUT (linux/tcp.h), which package syscall
// does not name.
const tcpUserTimeout = 0x12

// setUserTimeout sets TCP_USER_TIMEOUT on c, as grpc-go does on the
// connections it accepts itself (it recognises a *net.TCPConn only, which a
// guarded connection is not): data unacknowledged for d closes the
// connection, so that a peer gone while the server writes is noticed
// within the keepalive timeout.
func setUserTimeout(c net.Conn, d time.Duration) {
	t, ok := c.(*net.TCPConn)
	if !ok || d <= 0 {
		return
	}
	raw, err := t.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout, int(d/time.Millisecond))
	})
}
