"""Shapes: View (one strided, masked window on a buffer) and ShapeTracker (a stack of them)."""
from kc.shape.view import View, strides_for_shape
from kc.shape.shapetracker import ShapeTracker

__all__ = ["View", "ShapeTracker", "strides_for_shape"]
