"""Pure perturbation ops with per-sample parameters.

Images ``(B, C, H, W)`` in ``[0, 1]`` for every op but ``gaussian_noise`` and ``brightness_scale``,
which take any float tensor ``(B, ...)`` and a ``value_range`` (``None`` for unbounded values).
Checks that read values (range, NaN) run on every call; callers on a training path validate once.
``FOG_DENSITY`` and the ``RAIN_*`` tables hold the parameters of the weather's five severities.
The object ops (``follow_up_images``, ``transplant``, SPEC §3) also take each image's object mask and run
OpenCV on the CPU, image by image in a thread pool; they always read values.
"""

from dlguard.augment.functional.blur import bilateral_blur, box_blur, gaussian_blur, median_blur
from dlguard.augment.functional.geometric import rotation, scaling, shearing, translation
from dlguard.augment.functional.object_mutations import (
    FILL_COLORS,
    REMOVAL_REGIONS,
    follow_up_images,
    move_objects,
    transplant,
)
from dlguard.augment.functional.padding import PADDING_MODES, pad_resize, pad_resize_matrix
from dlguard.augment.functional.photometric import (
    brightness_scale,
    brightness_shift,
    contrast,
    gaussian_noise,
    reduced_contrast,
)
from dlguard.augment.functional.resolution import pixelate
from dlguard.augment.functional.translate import pad_to_region, region_translations
from dlguard.augment.functional.weather import (
    FOG_DENSITY,
    RAIN_BLUR,
    RAIN_DARKENING,
    RAIN_DROPS,
    RAIN_LENGTH,
    fog,
    plasma_field,
    rain,
    rain_streaks,
)

__all__ = [
    "FILL_COLORS",
    "FOG_DENSITY",
    "PADDING_MODES",
    "RAIN_BLUR",
    "RAIN_DARKENING",
    "RAIN_DROPS",
    "RAIN_LENGTH",
    "REMOVAL_REGIONS",
    "bilateral_blur",
    "box_blur",
    "brightness_scale",
    "brightness_shift",
    "contrast",
    "fog",
    "follow_up_images",
    "gaussian_blur",
    "gaussian_noise",
    "median_blur",
    "move_objects",
    "pad_resize",
    "pad_resize_matrix",
    "pad_to_region",
    "pixelate",
    "plasma_field",
    "rain",
    "rain_streaks",
    "reduced_contrast",
    "region_translations",
    "rotation",
    "scaling",
    "shearing",
    "translation",
    "transplant",
]
