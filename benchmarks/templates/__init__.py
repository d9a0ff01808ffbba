"""Do unrelated photos in the same template pass for copies? Dedup and detection on the template task.

* :mod:`.designs`: the templates (screenshot frames, meme bands, background photos, text and emoji overlays).
* :mod:`.task`: the dedup collection and the detection task built with them from ``train`` photos.
* :mod:`.systems`: every system on both tasks (pair AP, template-sharing false pairs, groups).
"""
