// Package timercount counts the runtime timers a piece of code makes
// (time.AfterFunc, NewTimer, NewTicker, and those of context.WithTimeout),
// for tests and benchmarks that bound them.
package timercount

import (
	"runtime"
	"strings"
	"sync"
)

var mu sync.Mutex // one count at a time: the profile rate is global

// Of runs f with every allocation profiled and returns the timers made
// meanwhile, by f or by any other goroutine.
func Of(f func()) int64 {
	mu.Lock()
	defer mu.Unlock()
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = rate }()
	before := made()
	f()
	return made() - before
}

// made returns the timers made so far, as far as the profile saw them.
func made() int64 {
	runtime.GC()
	runtime.GC() // a profile is published a cycle late
	var recs []runtime.MemProfileRecord
	for n, _ := runtime.MemProfile(nil, true); ; {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	var timers int64
	for _, r := range recs {
		// The timer itself, not the growth of the runtime's heaps of them.
		frames := runtime.CallersFrames(r.Stack())
		for {
			fr, more := frames.Next()
			if fr.Function == "runtime.mallocgc" || fr.Function == "runtime.newobject" {
				if more {
					continue
				}
			}
			if strings.HasSuffix(fr.Function, ".newTimer") {
				timers += r.AllocObjects
			}
			break
		}
	}
	return timers
}
