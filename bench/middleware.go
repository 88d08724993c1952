package bench

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/didip/tollbooth/v7"
	tblimiter "github.com/didip/tollbooth/v7/limiter"
	"github.com/go-chi/httprate"
	vargohttp "github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ulstdlib "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
)

// Middleware is a contender of the HTTP middleware comparison: Wrap puts
// next behind a limiter of rate requests per hour, keyed by the client's
// address, on an in-memory store; stop releases the store.
type Middleware struct {
	Name string
	Wrap func(rate int64, next http.Handler) (h http.Handler, stop func(), err error)
}

func nothing() {}

// Middlewares are sluice's httplimit and its peers, sluice first.
func Middlewares() []Middleware {
	return []Middleware{
		{"sluice-httplimit", func(rate int64, next http.Handler) (http.Handler, func(), error) {
			store := memory.New(nil)
			stop := func() { store.Close() }
			m, err := httplimit.New(store, []httplimit.Rule{{Name: "api", Limit: sluice.PerHour(rate), Key: httplimit.PeerIP()}}, nil)
			if err != nil {
				stop()
				return nil, nil, err
			}
			return m.Handler(next), stop, nil
		}},
		{"go-chi-httprate", func(rate int64, next http.Handler) (http.Handler, func(), error) {
			byIP := func(r *http.Request) (string, error) {
				host, _, err := net.SplitHostPort(r.RemoteAddr)
				return httprate.CanonicalizeIP(host), err
			}
			return httprate.LimitBy(int(rate), time.Hour, byIP)(next), nothing, nil
		}},
		{"ulule-limiter", func(rate int64, next http.Handler) (http.Handler, func(), error) {
			l := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: time.Hour, Limit: rate})
			return ulstdlib.NewMiddleware(l).Handler(next), nothing, nil
		}},
		{"sethvargo-go-limiter", func(rate int64, next http.Handler) (http.Handler, func(), error) {
			store, err := memorystore.New(&memorystore.Config{Tokens: uint64(rate), Interval: time.Hour})
			if err != nil {
				return nil, nil, err
			}
			stop := func() { store.Close(context.Background()) }
			m, err := vargohttp.NewMiddleware(store, vargohttp.IPKeyFunc())
			if err != nil {
				stop()
				return nil, nil, err
			}
			return m.Handle(next), stop, nil
		}},
		{"tollbooth", func(rate int64, next http.Handler) (http.Handler, func(), error) {
			l := tollbooth.NewLimiter(float64(rate)/3600, &tblimiter.ExpirableOptions{DefaultExpirationTTL: time.Hour})
			l.SetBurst(int(rate))
			l.SetIPLookups([]string{"RemoteAddr"})
			return tollbooth.LimitHandler(l, next), nothing, nil
		}},
	}
}
