// Command middleware serves every contender of the HTTP middleware
// comparison (package bench's Middlewares) for a load generator such as
// wrk: contender i answers allowed requests (a limit no run reaches) on
// port base+2i and denied ones (a limit of 1 per hour, already taken) on
// base+2i+1. Every request comes from the load generator's one address,
// so each port is one client's key.
//
//	go run ./cmd/middleware -base 18080 &
//	wrk -t1 -c32 -d10s http://127.0.0.1:18080/   # sluice-httplimit, allowed
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bench"
)

func main() {
	base := flag.Int("base", 18080, "first port")
	flag.Parse()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for i, m := range bench.Middlewares() {
		for j, rate := range []int64{sluice.MaxRate, 1} {
			h, _, err := m.Wrap(rate, ok)
			if err != nil {
				log.Fatalf("%s: %v", m.Name, err)
			}
			if rate == 1 { // take the one allowed request, as the load generator's address
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.RemoteAddr = "127.0.0.1:1"
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", *base+2*i+j)
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Fprintf(os.Stdout, "%s %s http://%s/\n", m.Name, []string{"allowed", "denied"}[j], addr)
			go http.Serve(ln, h)
		}
	}
	select {}
}
