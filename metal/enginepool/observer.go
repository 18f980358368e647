package enginepool

import "time"

// Observer receives the pool's events, synchronously from the goroutine that caused
// them and never under the pool mutex. Implementations must not block for long.
type Observer interface {
	// LoadFinished follows every load attempt; err is nil when the model is Ready.
	LoadFinished(ev LoadEvent)
	// Unloaded follows every stopped engine, with what it gave back.
	Unloaded(model string, r UnloadReport)
	// PressureChanged follows a change of the enforcer's level.
	PressureChanged(from, to PressureLevel)
}

// LoadEvent describes one finished load attempt.
type LoadEvent struct {
	Model    string
	Duration time.Duration
	Err      error
}

// AddObserver subscribes o to the pool's events.
func (p *Pool) AddObserver(o Observer) { p.st.change(change{kind: changeObserver, observer: o}) }
