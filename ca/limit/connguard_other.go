//go:build !linux

package limit

import (
	"net"
	"time"
)

// setUserTimeout does nothing where grpc-go sets no TCP_USER_TIMEOUT
// either.
func setUserTimeout(net.Conn, time.Duration) {}
