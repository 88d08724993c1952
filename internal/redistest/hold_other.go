//go:build !unix

package redistest

import (
	"fmt"
	"net"
)

// holdPort cannot hold a port here: it returns one free now, as freePort
// does, and a close that does nothing. Another listener may take it
// before the test dials it.
func holdPort(port int) (held int, close func(), err error) {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return 0, nil, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, func() {}, nil
}
