"""The legacy RawNIND rules (github.com/trougnouf/rawnind_jddc), written here from reading
`libs/rawproc.py`, `libs/raw.py`, `libs/rawds.py`, `tools/prep_image_dataset.py` and
`tools/crop_datasets.py`, as small independent references for the tests. Nothing here imports
wdsprep's rawnind code.

- `shift_images`: the aligned anchor (clean, RGB) and target (noisy, RGB or 4-channel Bayer) images.
- `demosaic`: `raw.demosaic` (OpenCV EA on a uint16 copy scaled by the image's own range).
- `mono`: `raw.raw_fpath_to_mono_img_and_metadata` for the synthetic DNGs (RGGB, no margins).
- `alignment_loss`: the loss `find_best_alignment` reports at a shift.
- `precrops`: the pre-crop coordinates of `crop_datasets.create_raw_img_crops`.
- `scene_pairs`: the (gt, f) pairs of `prep_image_dataset.py`.
"""
import cv2
import numpy as np
import rawpy

XYZ_TO_REC2020 = np.array([[1.71666343, -0.35567332, -0.25336809], [-0.66667384, 1.61645574, 0.0157683],
                           [0.01764248, -0.04277698, 0.94224328]], dtype=np.float32)


def mono(path):
    """[1, H, W] float32 `(x - black[0]) / (white - black[0])` and the raw file's matrix."""
    with rawpy.imread(str(path)) as raw:
        black = float(raw.black_level_per_channel[0])
        image = raw.raw_image.astype(np.float32)
        matrix = np.array(raw.rgb_xyz_matrix, dtype=np.float32)
        white = raw.white_level
    height, width = image.shape
    image = image[: height - height % 4, : width - width % 4]
    return ((image - np.float32(black)) / np.float32(white - black))[None], matrix


def demosaic(mono_img):
    """raw.demosaic: lift a negative minimum, scale a maximum above 1, uint16, EA, scale back."""
    img = mono_img.copy()
    offset = np.float32(0.0) if img.min() >= 0 else -img.min()
    img += offset
    top = np.float32(1.0) if img.max() <= 1.0 else img.max()
    img /= top
    img *= 65535
    img = img.astype(np.uint16).reshape(img.shape[1:] + (1,))
    rgb = cv2.demosaicing(img, cv2.COLOR_BayerRGGB2RGB_EA).transpose(2, 0, 1)
    return rgb.astype(np.float32) / 65535.0 * top - offset


def to_rec2020(cam_rgb, rgb_xyz_matrix):
    matrix = XYZ_TO_REC2020 @ np.linalg.inv(np.asarray(rgb_xyz_matrix, dtype=np.float32)[:3])
    return (matrix @ cam_rgb.reshape(3, -1)).reshape(cam_rgb.shape)


def shift_images(anchor, target, shift):
    """rawproc.shift_images, for an RGB anchor and an RGB or Bayer (4-channel, half size) target."""
    divisor = 2 if target.shape[0] == 4 else 1
    dy, dx = shift
    if dy > 0:
        anchor, target = anchor[..., dy:, :], target[..., : -(dy // divisor) or None, :]
        if dy % 2:
            anchor, target = anchor[..., :-1, :], target[..., :-1, :]
    elif dy < 0:
        anchor, target = anchor[..., :dy, :], target[..., -dy // divisor :, :]
        if dy % 2:
            anchor, target = anchor[..., 1:, :], target[..., 1:, :]
    if dx > 0:
        anchor, target = anchor[..., dx:], target[..., : -(dx // divisor) or None]
        if dx % 2:
            anchor, target = anchor[..., :-1], target[..., :-1]
    elif dx < 0:
        anchor, target = anchor[..., :dx], target[..., -dx // divisor :]
        if dx % 2:
            anchor, target = anchor[..., 1:], target[..., 1:]
    return anchor, target


def alignment_loss(gt_rgb, f_rgb, shift):
    """find_best_alignment's loss at `shift`: mean L1 of the RGB images, the target gain-matched."""
    matched = f_rgb * (gt_rgb.mean() / f_rgb.mean())
    anchor, target = shift_images(gt_rgb, matched, shift)
    return float(np.abs(anchor - target).mean())


def precrops(height, width):
    """[x, y] half-resolution coordinates and (top, left, h, w) full-resolution regions of the
    pre-crops of an H x W capture (1024 RGGB pixels, stride 1024 - 256, while 256 + 128 fit)."""
    h_raw, w_raw = height // 2, width // 2
    out = []
    cur_w = cur_h = 0
    while cur_w + 256 + 128 < w_raw - w_raw % 16:
        while cur_h + 256 + 128 < h_raw - h_raw % 16:
            h2, w2 = min(cur_h + 1024, h_raw - h_raw % 16), min(cur_w + 1024, w_raw - w_raw % 16)
            out.append(([cur_w, cur_h], (2 * cur_h, 2 * cur_w, 2 * (h2 - cur_h), 2 * (w2 - cur_w))))
            cur_h += 1024 - 256
        cur_h = 0
        cur_w += 1024 - 256
    return sorted(out)  # the loaders sort a pair's crops by coordinates


def aligned_precrop(region, shift):
    """(clean top, clean left, noisy top, noisy left, h, w) in the image of a pre-crop once
    `shift_images` aligned its clean and noisy (Bayer) crops: found by shifting coordinate maps."""
    top, left, height, width = region
    rows = np.broadcast_to(np.arange(top, top + height)[:, None], (height, width))
    cols = np.broadcast_to(np.arange(left, left + width)[None, :], (height, width))
    anchor = np.stack([rows, cols, rows])  # an RGB "image" of coordinates
    target = np.stack([rows[::2, ::2], cols[::2, ::2], rows[::2, ::2], cols[::2, ::2]])  # RGGB: R site coordinates
    a, t = shift_images(anchor, target, shift)
    assert a.shape[1] == 2 * t.shape[1] and a.shape[2] == 2 * t.shape[2]
    return int(a[0, 0, 0]), int(a[1, 0, 0]), int(t[0, 0, 0]), int(t[1, 0, 0]), a.shape[1], a.shape[2]


def center_crop(height, width, crop):
    ystart, xstart = height // 2 - crop // 2, width // 2 - crop // 2
    return ystart - ystart % 2, xstart - xstart % 2


def grid(height, width, crop):
    out, y = [], 0
    while y < height:
        x = 0
        while x < width:
            if y + crop <= height and x + crop <= width:
                out.append((y, x))
            x += crop
        y += crop
    return out


def scene_pairs(clean, noisy):
    """prep_image_dataset.py: every clean file is a gt, paired with every clean and noisy file."""
    return [(gt, f) for gt in clean for f in clean + noisy]
