//go:build !linux

package hostile

import "syscall"

// bindNoPort is Linux's; elsewhere the kernel picks ports at bind.
func bindNoPort(_, _ string, _ syscall.RawConn) error { return nil }
