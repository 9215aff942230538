package etcdwatch

import (
	"reflect"
	"sync"
	"unsafe"
)

// viewKey says which views may share a state: those of the same range,
// decoding with the same function to the same type, with the same options.
type viewKey struct {
	key, end string
	decode   uintptr // funcID of the Decoder
	typ      reflect.Type
	opts     viewOptions
}

// viewRegistry holds a Stream's shared view states.
type viewRegistry struct {
	mu     sync.Mutex
	cores  map[viewKey]any // *viewCore[T] for the key's typ
	closed bool            // the Stream is closing: no new states start
	wg     sync.WaitGroup  // running states; Stream.Close waits
}

// funcID identifies a func value by the address of its closure record. Two
// values have the same one only when they are the same top-level function
// (or generic instance, or closure without captured variables) or copies of
// one closure value, so views share a state only when they decode alike.
// reflect's Pointer would not do: it gives the code, which every closure of
// one function literal shares whatever it captured.
func funcID[F any](f F) uintptr { return *(*uintptr)(unsafe.Pointer(&f)) }

// acquireView returns the running state of views like r's on s, one more
// reference to it, or a new state, started.
func acquireView[T any](s *Stream, r Request, decode Decoder[T], o viewOptions) *viewCore[T] {
	k := viewKey{key: string(r.Key), end: string(r.End), decode: funcID(decode), typ: reflect.TypeFor[T](), opts: o}
	reg := &s.views
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if c, ok := reg.cores[k].(*viewCore[T]); ok && !c.ended() {
		c.refs++
		return c
	}
	c := newViewCore(s, r, decode, o)
	c.key, c.refs = k, 1
	if reg.closed {
		c.endBeforeStart(ErrClosed)
		return c
	}
	if reg.cores == nil {
		reg.cores = make(map[viewKey]any)
	}
	reg.cores[k] = c
	reg.wg.Go(c.start) // returns when the state ends: its last View closed, the Stream closed, or refused for good; Stream.Close waits
	return c
}

// releaseView drops a reference to c; the last one ends c and waits for it.
func releaseView[T any](c *viewCore[T]) {
	reg := &c.stream.views
	reg.mu.Lock()
	c.refs--
	last := c.refs == 0
	if last && reg.cores[c.key] == any(c) {
		delete(reg.cores, c.key)
	}
	reg.mu.Unlock()
	if last {
		c.cancel(ErrViewClosed)
		<-c.done
	}
}

// close stops new states from starting; the running ones end with the
// Stream's base context, which Close cancels first.
func (reg *viewRegistry) close() {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	reg.closed = true
}

// wait waits for every state to end.
func (reg *viewRegistry) wait() { reg.wg.Wait() }
