"""Loading models: torchvision, EfficientNet-Lite0 and custom factories, their weights, class names and device."""
