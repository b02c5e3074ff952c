package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// listeningPorts returns the TCP ports process pid listens on, read from
// /proc: the sockets among its open files that are in LISTEN state. It
// lets a server started on port 0 tell where the kernel put it, with no
// window in which another process could take a port picked in advance.
func listeningPorts(pid int) ([]int, error) {
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] {
				continue
			}
			_, portHex, _ := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseInt(portHex, 16, 32); err == nil {
				ports = append(ports, int(p))
			}
		}
		f.Close()
	}
	return ports, nil
}

// waitListening waits until pid listens on at least n ports and returns
// them.
func waitListening(pid, n int, timeout time.Duration) ([]int, error) {
	deadline := time.Now().Add(timeout)
	for {
		ports, err := listeningPorts(pid)
		if err == nil && len(ports) >= n {
			return ports, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("process %d listens on %v after %v, want %d ports (%v)", pid, ports, timeout, n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
