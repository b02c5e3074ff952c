package hostile

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindNoPort lets the kernel pick a connection's source port at
// connect, not at bind, so that thousands of connections from one
// source address to a few servers do not run out of ports (a port in
// TIME_WAIT to one server is free for another).
func bindNoPort(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}
