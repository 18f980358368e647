package httpserver

import (
	"strconv"
	"time"

	"golang.org/x/time/rate"
)

// displacements bounds how fast each source's new connections take the slots of
// open ones at a cap: a token bucket per source (golang.org/x/time/rate, its time
// given, so decisions take a fake clock), kept while the source holds a connection.
// Under the listener's lock.
type displacements struct {
	limit    rate.Limit
	burst    int
	bySource map[string]*rate.Limiter
}

func newDisplacements(perSecond float64, burst int) *displacements {
	if perSecond < 0 || burst < 0 {
		return nil
	}
	return &displacements{limit: rate.Limit(perSecond), burst: burst, bySource: map[string]*rate.Limiter{}}
}

// allow takes one of src's displacements at now, and says whether there was one. A
// nil displacements allows every one.
func (d *displacements) allow(src string, now time.Time) bool {
	if d == nil {
		return true
	}
	lim := d.bySource[src]
	if lim == nil {
		lim = rate.NewLimiter(d.limit, d.burst)
		d.bySource[src] = lim
	}
	return lim.AllowN(now, 1)
}

// spent says whether src has no displacement left at now, taking none: a check
// before looking for a connection to displace, so that a source past its rate is
// refused without a scan of its connections.
func (d *displacements) spent(src string, now time.Time) bool {
	if d == nil {
		return false
	}
	lim := d.bySource[src]
	return lim != nil && lim.TokensAt(now) < 1
}

// forget drops src's bucket once it holds no connection: a source comes back with a
// full bucket, but it must first have closed every connection it held.
func (d *displacements) forget(src string) {
	if d != nil {
		delete(d.bySource, src)
	}
}

// churnRefusal is the response of a connection that would take an open one's slot
// (at the cap of perSource from its address or of max in all) when its source has
// taken slots faster than d allows.
func churnRefusal(max, perSource int, d *displacements) []byte {
	if d == nil {
		return nil
	}
	return refusal("this server is at its limit of open connections (" + strconv.Itoa(perSource) + " from one address, " +
		strconv.Itoa(max) + " in all), and new ones from your address may take the slots of idle ones at most " +
		strconv.FormatFloat(float64(d.limit), 'g', -1, 64) + " a second; reuse kept-alive connections instead of opening new ones, then retry")
}
