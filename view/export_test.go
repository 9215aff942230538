package view

import "context"

// This file lets the black-box tests wait on a view without it asking the
// server anything, and ask for progress on a view's watch alone.

// AwaitRevision waits until v has published a state at rev or later, or
// ctx ends. Unlike WaitForRevision it never asks the server.
func AwaitRevision[T any](ctx context.Context, v *View[T], rev int64) error {
	return v.core.await(ctx, atLeast[T](rev))
}

// RequestProgress asks for progress on v's watch alone.
func RequestProgress[T any](ctx context.Context, v *View[T]) (int64, error) {
	return v.core.progress(ctx)
}
