package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/grpclog"
)

// clip shortens a client-chosen string for a log line or an error detail,
// which must not grow with the input: past n bytes it is cut at a rune
// boundary and says how long it was.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

// clipQuoted is s quoted, its first n bytes only when it is longer, with
// its length after the closing quote.
func clipQuoted(s string, n int) string {
	if len(s) <= n {
		return strconv.Quote(s)
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q…(%d bytes)", s[:cut], len(s))
}

// logClip is how much of a client-chosen string a log line shows.
const logClip = 64

// ErrLogOption is wrapped by errors about --log-format and --log-level.
var ErrLogOption = errors.New("server: invalid log option")

// NewLogger returns a logger writing to w in format "text" (slog's
// key=value lines; the default when format is "") or "json" (one JSON
// object a line), dropping records below level ("debug", "info" — the
// default when level is "" —, "warn" or "error").
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if level != "" {
		if err := lv.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("%w: log level %q: want debug, info, warn or error", ErrLogOption, level)
		}
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationString}
	switch strings.ToLower(format) {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w: log format %q: want text or json", ErrLogOption, format)
}

// durationString writes durations as people read them ("1s"): the JSON
// handler would write nanoseconds, the text handler already does this.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// RouteLogs sends every library's log through log: the standard log
// package (net/http's errors among them), go-redis and grpc-go. Those
// loggers are global, so call it once, at the start of a program, before
// any client or server is made.
func RouteLogs(log *slog.Logger) {
	slog.SetDefault(log)
	redis.SetLogger(redisLogger{log.With("logger", "go-redis"), &quiet{lines: map[string]*quietLine{}}})
	grpclog.SetLoggerV2(grpcLogger{log.With("logger", "grpc"), &quiet{lines: map[string]*quietLine{}}})
}

// redisLogger hands go-redis's lines (pool and Sentinel events) to slog.
// go-redis gives them no level; they tell of connections coming and going,
// which an operator wants to see at the default level.
type redisLogger struct {
	log *slog.Logger
	*quiet
}

// quiet lets a line of one format through once per quietFor, with the
// number of its repeats held back meanwhile: go-redis logs each failed
// dial of each call, dozens a second while Redis refuses connections,
// where sluice's own lines say the store was lost once.
type quiet struct {
	mu    sync.Mutex
	lines map[string]*quietLine
}

type quietLine struct {
	at      time.Time
	dropped int
}

const quietFor = 10 * time.Second

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if l.quiet == nil {
		l.log.InfoContext(ctx, msg)
		return
	}
	// Held back by format: a failed dial's line differs by its attempt
	// count or connection number and is the same news. A Sentinel's line
	// names a master, and a new one is news: those go by the line.
	key := format
	if strings.Contains(format, "sentinel") {
		key = msg
	}
	ok, dropped := l.allow(key)
	switch {
	case !ok:
	case dropped > 0:
		l.log.InfoContext(ctx, msg, "repeats_not_logged", dropped)
	default:
		l.log.InfoContext(ctx, msg)
	}
}

// allow reports whether a line of key goes out now, and how many of its
// repeats were held back since the last that did.
func (q *quiet) allow(key string) (ok bool, dropped int) {
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.lines[key]
	if l == nil {
		if len(q.lines) >= 1000 { // formats and masters are few; keep it bounded all the same
			clear(q.lines)
		}
		l = &quietLine{}
		q.lines[key] = l
	} else if now.Sub(l.at) < quietFor {
		l.dropped++
		return false, 0
	}
	dropped = l.dropped
	l.at, l.dropped = now, 0
	return true, dropped
}

// grpcLogger hands grpc-go's log to slog. Its info lines are chatty
// (every connection's state), so they go out at debug level. A warning
// repeated word for word goes out once per quietFor, with the number held
// back: each call whose connection closed before its status was written
// (a client gone, or the connection cap closing stalled calls) is one.
type grpcLogger struct {
	log *slog.Logger
	*quiet
}

func (l grpcLogger) Info(args ...any)                 { l.log.Debug(fmt.Sprint(args...)) }
func (l grpcLogger) Infoln(args ...any)               { l.log.Debug(sprintln(args)) }
func (l grpcLogger) Infof(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l grpcLogger) Warning(args ...any)              { l.warn(fmt.Sprint(args...)) }
func (l grpcLogger) Warningln(args ...any)            { l.warn(sprintln(args)) }
func (l grpcLogger) Warningf(format string, args ...any) {
	l.warn(fmt.Sprintf(format, args...))
}

func (l grpcLogger) warn(msg string) {
	if l.quiet == nil {
		l.log.Warn(msg)
		return
	}
	ok, dropped := l.allow(msg)
	switch {
	case !ok:
	case dropped > 0:
		l.log.Warn(msg, "repeats_not_logged", dropped)
	default:
		l.log.Warn(msg)
	}
}

func (l grpcLogger) Error(args ...any)                 { l.log.Error(fmt.Sprint(args...)) }
func (l grpcLogger) Errorln(args ...any)               { l.log.Error(sprintln(args)) }
func (l grpcLogger) Errorf(format string, args ...any) { l.log.Error(fmt.Sprintf(format, args...)) }
func (l grpcLogger) Fatal(args ...any)                 { l.Error(args...); os.Exit(1) }
func (l grpcLogger) Fatalln(args ...any)               { l.Errorln(args...); os.Exit(1) }
func (l grpcLogger) Fatalf(format string, args ...any) { l.Errorf(format, args...); os.Exit(1) }

// V reports whether verbose logging at level v is wanted: never, as
// grpc-go's own default.
func (grpcLogger) V(v int) bool { return v <= 0 }

func sprintln(args []any) string { return strings.TrimSuffix(fmt.Sprintln(args...), "\n") }

// storeAttr describes the store for the startup line: "memory", or
// Redis's mode, addresses and database, with the URL's password masked.
func (s *Server) storeAttr() slog.Attr {
	switch c := s.redis.(type) {
	case *redis.ClusterClient:
		return slog.Group("store", "kind", "redis", "mode", "cluster",
			"addrs", c.Options().Addrs, "url", redactURL(s.opts.RedisURL))
	case *redis.Client:
		o := c.Options()
		attrs := []any{"kind", "redis", "mode", "standalone", "addrs", []string{o.Addr}}
		if fo := s.sentinel(); fo != nil {
			attrs = []any{"kind", "redis", "mode", "sentinel", "master", fo.MasterName, "sentinels", fo.SentinelAddrs}
		}
		return slog.Group("store", append(attrs, "db", o.DB, "tls", o.TLSConfig != nil, "url", redactURL(s.opts.RedisURL))...)
	case nil:
		if s.opts.Store != nil {
			return slog.Group("store", "kind", fmt.Sprintf("%T", s.opts.Store))
		}
		return slog.Group("store", "kind", "memory", "max_keys", s.opts.MaxKeys)
	}
	return slog.Group("store", "kind", "redis", "url", redactURL(s.opts.RedisURL))
}

// sentinel returns the Sentinel options of the --redis URL, nil for any
// other kind of URL.
func (s *Server) sentinel() *redis.FailoverOptions {
	if c, ok := s.redis.(*redis.Client); !ok || c.Options().Addr != "FailoverClient" {
		return nil
	}
	raw, _, err := storeURLOptions(s.opts.RedisURL)
	if err != nil {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	u.Scheme, _, _ = strings.Cut(u.Scheme, "+")
	o, err := failoverOptions(u)
	if err != nil {
		return nil
	}
	return o
}

// redactURL returns rawURL with its password, if any, masked.
func redactURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable)"
	}
	q := u.Query()
	for k := range q {
		if strings.Contains(strings.ToLower(k), "password") {
			q.Set(k, "xxxxx")
		}
	}
	u.RawQuery = q.Encode()
	return u.Redacted()
}
