package wal

// padNext returns the next index for the test group "pad".
func (w *WAL) padNext() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.released["pad"] + 1
}

// preparedActive reports whether the active segment is a prepared one.
func (w *WAL) preparedActive() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.activePrepared
}
